//! The etcd store (to be written).
