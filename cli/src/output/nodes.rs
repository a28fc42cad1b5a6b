//! `nodes`: the fleet table, with each node's refused version below it.

use serde::Serialize;
use switchyard_proto::admin::v1 as pb;

use super::text::{Table, ago};

#[derive(Debug, Serialize)]
pub struct NodeView {
    pub node_id: String,
    pub listen_address: String,
    pub applied_version: i64,
    pub lag: i64,
    pub last_heartbeat_unix_ms: i64,
    pub control_plane: String,
    pub software_version: String,
    pub connected_unix_ms: i64,
    /// The last version the node refused, and why (`null` when it applied everything).
    pub rejected: Option<RejectedView>,
}

#[derive(Debug, Serialize)]
pub struct RejectedView {
    pub version: i64,
    pub error: String,
}

#[derive(Debug, Serialize)]
pub struct NodesView {
    pub config_version: i64,
    pub nodes: Vec<NodeView>,
}

impl From<pb::ListNodesResponse> for NodesView {
    fn from(r: pb::ListNodesResponse) -> Self {
        let nodes = r.nodes.into_iter().map(NodeView::from).collect();
        Self { config_version: r.config_version, nodes }
    }
}

impl From<pb::Node> for NodeView {
    fn from(n: pb::Node) -> Self {
        NodeView {
            node_id: n.node_id,
            listen_address: n.listen_address,
            applied_version: n.applied_version,
            lag: n.lag,
            last_heartbeat_unix_ms: n.last_heartbeat_unix_ms,
            control_plane: n.control_plane,
            software_version: n.software_version,
            connected_unix_ms: n.connected_unix_ms,
            rejected: (n.rejected_version > 0)
                .then_some(RejectedView { version: n.rejected_version, error: n.rejected_error }),
        }
    }
}

/// What `nodes --json` prints before its nodes, which follow as a [`super::JsonArray`] at
/// indent 2; [`nodes_json_tail`] closes it. Together: exactly `json(&NodesView)`.
pub fn nodes_json_head(config_version: i64) -> String {
    format!("{{\n  \"config_version\": {config_version},\n  \"nodes\": ")
}

pub fn nodes_json_tail(nodes: &super::JsonArray) -> String {
    format!("{}\n}}\n", nodes.end())
}

pub fn nodes_table(v: &NodesView, now_ms: i64) -> String {
    if v.nodes.is_empty() {
        return format!("no nodes (config version {})\n", v.config_version);
    }
    nodes_rows(&v.nodes, now_ms, true)
}

/// One page of the node table (with its header for the first page), and the page's
/// rejections below it.
pub fn nodes_rows(nodes: &[NodeView], now_ms: i64, header: bool) -> String {
    let mut t = Table::new(["NODE", "LISTEN", "VERSION", "LAG", "LAST HEARTBEAT", "CONTROL PLANE"]);
    for n in nodes {
        t.row(vec![
            n.node_id.clone(),
            n.listen_address.clone(),
            n.applied_version.to_string(),
            n.lag.to_string(),
            ago(n.last_heartbeat_unix_ms, now_ms),
            n.control_plane.clone(),
        ]);
    }
    let text = t.render();
    let mut out = if header {
        text
    } else {
        text.split_once('\n').map_or(text.clone(), |(_, rows)| rows.to_owned())
    };
    // Rejections below the table: an error message would stretch every row's columns.
    for n in nodes {
        if let Some(r) = &n.rejected {
            out.push_str(&format!("{} rejected version {}: {}\n", n.node_id, r.version, r.error));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_json_printed_node_by_node_is_the_whole_view_printed_at_once() {
        for n in [0usize, 1, 3] {
            let node = |i: usize| pb::Node {
                node_id: format!("n{i}"),
                rejected_version: if i == 1 { 7 } else { 0 },
                rejected_error: "bad".into(),
                ..Default::default()
            };
            let whole = NodesView::from(pb::ListNodesResponse {
                nodes: (0..n).map(node).collect(),
                config_version: 42,
                next_page_token: String::new(),
            });
            let mut array = crate::output::JsonArray::new(2);
            let mut text = nodes_json_head(42);
            for i in 0..n {
                text.push_str(&array.item(&NodeView::from(node(i))).unwrap());
            }
            text.push_str(&nodes_json_tail(&array));
            assert_eq!(text, crate::output::json(&whole).unwrap(), "{n} nodes");
        }
    }

    #[test]
    fn nodes_table_shows_heartbeat_age() {
        let v = NodesView::from(pb::ListNodesResponse {
            nodes: vec![pb::Node {
                node_id: "n1".into(),
                listen_address: "10.0.0.1:8080".into(),
                applied_version: 41,
                lag: 1,
                last_heartbeat_unix_ms: 7_000,
                control_plane: "cp-a".into(),
                ..Default::default()
            }],
            config_version: 42,
            next_page_token: String::new(),
        });
        let text = nodes_table(&v, 10_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "NODE  LISTEN         VERSION  LAG  LAST HEARTBEAT  CONTROL PLANE");
        assert_eq!(lines[1], "n1    10.0.0.1:8080  41       1    3s ago          cp-a");
    }
}
