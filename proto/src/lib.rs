//! Generated gRPC types. Domain code converts them into validated types at its boundary.
#![allow(clippy::all)]

pub mod admin {
    pub mod v1 {
        tonic::include_proto!("switchyard.admin.v1");
    }
}

pub mod node {
    pub mod v1 {
        tonic::include_proto!("switchyard.node.v1");
    }
}

/// Client stubs for etcd's v3 API (the server half is generated too but unused).
pub mod etcd {
    tonic::include_proto!("etcdserverpb");
}
