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
    let builder = tonic_prost_build::configure()
        // Only the admin listing sets it: boxed, so that the events a node holds by the
        // thousand do not each carry its room.
        .boxed(".switchyard.node.v1.FailoverEvent.lost")
        // They carry an etcd password or token: their Debug (proto/src/lib.rs) hides it.
        .skip_debug([
            ".etcdserverpb.AuthenticateRequest",
            ".etcdserverpb.AuthenticateResponse",
            ".etcdserverpb.AuthUserAddRequest",
        ]);
    event_json(builder).build_server(true).build_client(true).compile_fds(descriptors)?;
    encoded_node_server();
    Ok(())
}

/// The failover event's JSON form, defined here once: the control plane stores it as the
/// audit record and the CLI prints its attempts and continuations with
/// `events --json`. Fields without an attribute are required when read; `default` fields
/// read as empty when absent (records from releases before them); `skip_serializing_if`
/// fields are left out of the JSON when empty, as records have always been written.
fn event_json(builder: tonic_prost_build::Builder) -> tonic_prost_build::Builder {
    const DEFAULT: &str = "#[serde(default)]";
    const UNLESS_EMPTY: &str = r#"#[serde(default, skip_serializing_if = "String::is_empty")]"#;
    let event = ".switchyard.node.v1.FailoverEvent";
    let attempt = ".switchyard.node.v1.Attempt";
    let mut builder = builder;
    for message in
        [event, attempt, ".switchyard.node.v1.Continuation", ".switchyard.node.v1.EventsLost"]
    {
        builder =
            builder.type_attribute(message, "#[derive(serde::Serialize, serde::Deserialize)]");
    }
    for field in ["served_model", "attempts", "stream", "status"] {
        builder = builder.field_attribute(format!("{event}.{field}"), DEFAULT);
    }
    for field in ["degraded", "request_id", "surface"] {
        builder = builder.field_attribute(format!("{event}.{field}"), UNLESS_EMPTY);
    }
    for field in ["reason", "latency_ms", "probe"] {
        builder = builder.field_attribute(format!("{attempt}.{field}"), DEFAULT);
    }
    for field in ["injected", "deployment"] {
        builder = builder.field_attribute(format!("{attempt}.{field}"), UNLESS_EMPTY);
    }
    builder
        .field_attribute(
            format!("{event}.lost"),
            r#"#[serde(default, skip_serializing_if = "Option::is_none")]"#,
        )
        .field_attribute(
            format!("{event}.continued"),
            r#"#[serde(default, skip_serializing_if = "Vec::is_empty")]"#,
        )
        .field_attribute(
            format!("{attempt}.retries"),
            r#"#[serde(default, skip_serializing_if = "crate::json::is_zero")]"#,
        )
        .field_attribute(
            format!("{attempt}.local_limit"),
            r#"#[serde(default, skip_serializing_if = "std::ops::Not::not")]"#,
        )
        // An `events.lost` entry keeps its id once, as the entry's `id`: the control plane
        // fills it in again when it reads the entry.
        .field_attribute(".switchyard.node.v1.EventsLost.id", "#[serde(skip)]")
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
