//! `ListBreakers`: every node's breakers as they reported them, with the fleet's view.

use tonic::{Request, Response, Status};

use switchyard_proto::admin::v1 as pb;
use switchyard_proto::node::BreakerState;

use super::service::{AdminError, AdminService};
use crate::events::BreakerRecord;

/// Each connected node treats a deployment open for the fleet as open: its row says so
/// (state `open`, cause `fleet`: `open (fleet)` in the table) unless its own breaker of it
/// is open or half-open already. The prober's own breaker opens as it starts probing.
fn with_fleet(
    breakers: &mut Vec<pb::Breaker>,
    open: &[switchyard_proto::node::v1::FleetBreaker],
    nodes: &std::collections::BTreeSet<String>,
) {
    for deployment in open {
        for node in nodes {
            let own = breakers.iter_mut().find(|b| {
                &b.node_id == node
                    && b.provider == deployment.provider
                    && b.upstream_model == deployment.upstream_model
            });
            let row = match own {
                Some(b) if BreakerState::is_open(&b.state) => continue,
                Some(b) => b,
                None => {
                    breakers.push(pb::Breaker {
                        node_id: node.clone(),
                        provider: deployment.provider.clone(),
                        upstream_model: deployment.upstream_model.clone(),
                        ..Default::default()
                    });
                    let Some(row) = breakers.last_mut() else { continue };
                    row
                }
            };
            row.state = BreakerState::Open.as_str().to_owned();
            row.cause = "fleet".to_owned();
            row.since_unix_ms = deployment.since_unix_ms;
            row.next_probe_unix_ms = 0;
        }
    }
}

pub(super) async fn list_breakers(
    admin: &AdminService,
    _request: Request<pb::ListBreakersRequest>,
) -> Result<Response<pb::ListBreakersResponse>, Status> {
    let listing =
        admin.store.list(&admin.layout.breakers_prefix()).await.map_err(AdminError::from)?;
    let mut breakers: Vec<pb::Breaker> = listing
        .kvs
        .iter()
        .filter_map(|kv| serde_json::from_slice::<BreakerRecord>(&kv.value).ok())
        .map(pb::Breaker::from)
        .collect();
    let fleet = admin.fleet.current();
    with_fleet(&mut breakers, &fleet.view.open, &fleet.nodes);
    // By node, provider, model: the order the table shows.
    breakers.sort_by(|a, b| {
        (&a.node_id, &a.provider, &a.upstream_model).cmp(&(
            &b.node_id,
            &b.provider,
            &b.upstream_model,
        ))
    });
    Ok(Response::new(pb::ListBreakersResponse {
        breakers,
        fleet: fleet.view.open.clone(),
        fleet_enabled: fleet.view.enabled,
    }))
}
