//! `ListNodes`: the fleet as the nodes' presence records show it.

use tonic::{Request, Response, Status};

use switchyard_proto::admin::v1 as pb;
use switchyard_time::now_ms;

use super::service::{AdminError, AdminService};
use crate::nodes::NodeRecord;
use crate::paging;

pub(super) async fn list_nodes(
    admin: &AdminService,
    request: Request<pb::ListNodesRequest>,
) -> Result<Response<pb::ListNodesResponse>, Status> {
    let request = request.into_inner();
    let mode = paging::mode(paging::Listing::Nodes, request.limit, &request.page_token)
        .map_err(AdminError::from)?;
    let config_version = admin.cache.latest_change();
    let stale_for = i64::try_from(request.stale_for_ms).unwrap_or(i64::MAX);
    let now = now_ms();
    let page = paging::scan(
        admin.store.as_ref(),
        paging::Listing::Nodes,
        &admin.layout.nodes_prefix(),
        "",
        &mode,
        |kv| {
            // An unreadable record (a node of another version mid-upgrade) is left out,
            // as before paging.
            let Ok(n) = serde_json::from_slice::<NodeRecord>(&kv.value) else {
                return Ok::<_, AdminError>(None);
            };
            let wanted = (request.control_plane.is_empty()
                || n.control_plane == request.control_plane)
                && (stale_for == 0 || now.saturating_sub(n.last_heartbeat_unix_ms) >= stale_for)
                && (!request.rejected_only || n.rejected.is_some());
            Ok(wanted.then(|| pb::Node {
                lag: (config_version - n.applied_version).max(0),
                node_id: n.node_id,
                listen_address: n.listen_address,
                applied_version: n.applied_version,
                last_heartbeat_unix_ms: n.last_heartbeat_unix_ms,
                control_plane: n.control_plane,
                software_version: n.software_version,
                connected_unix_ms: n.connected_unix_ms,
                rejected_version: n.rejected.as_ref().map_or(0, |r| r.version),
                rejected_error: n.rejected.map(|r| r.error).unwrap_or_default(),
            }))
        },
        prost::Message::encoded_len,
    )
    .await?;
    Ok(Response::new(pb::ListNodesResponse {
        nodes: page.items,
        config_version,
        next_page_token: page.next_token,
    }))
}
