//! Compiles the .proto files with protox, a protobuf compiler written in Rust, so that a
//! machine without a system `protoc` builds Switchyard.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/switchyard/admin/v1/admin.proto",
        "proto/switchyard/node/v1/node.proto",
        "proto/etcd/etcd.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        // Only the admin listing sets it: boxed, so that the events a node holds by the
        // thousand do not each carry its room.
        .boxed(".switchyard.node.v1.FailoverEvent.lost")
        // They carry an etcd password or token: their Debug (proto/src/lib.rs) hides it.
        .skip_debug([
            ".etcdserverpb.AuthenticateRequest",
            ".etcdserverpb.AuthenticateResponse",
            ".etcdserverpb.AuthUserAddRequest",
        ])
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    encoded_node_server();
    Ok(())
}

/// The control plane's side of `NodeControl.Connect` again, with responses that are already
/// encoded `ControlMessage`s: a config change is encoded once and the same bytes go to every
/// node. Route, framing and wire format are the generated service's; nodes (the generated
/// client) cannot tell them apart.
fn encoded_node_server() {
    let connect = tonic_build::manual::Method::builder()
        .name("connect")
        .route_name("Connect")
        .input_type("crate::node::v1::NodeMessage")
        .output_type("crate::node::encoded::EncodedControlMessage")
        .codec_path("crate::node::encoded::EncodedCodec")
        .client_streaming()
        .server_streaming()
        .build();
    let service = tonic_build::manual::Service::builder()
        .name("NodeControl")
        .package("switchyard.node.v1")
        .method(connect)
        .build();
    tonic_build::manual::Builder::new().build_client(false).compile(&[service]);
}
