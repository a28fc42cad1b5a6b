//! `InjectFault`, `ListFaults` and `ClearFaults`: injected faults ([`crate::faults`]).

use std::time::Duration;

use tonic::{Request, Response, Status};

use switchyard_catalog::fault::{DEFAULT_TTL, Fault};
use switchyard_catalog::{FieldError, ValidationErrors};
use switchyard_proto::admin::v1 as pb;

use super::service::{AdminError, AdminService, invalid};
use crate::faults;

pub(super) async fn inject_fault(
    admin: &AdminService,
    request: Request<pb::InjectFaultRequest>,
) -> Result<Response<pb::InjectFaultResponse>, Status> {
    let request = request.into_inner();
    let deserializer = &mut serde_json::Deserializer::from_str(&request.fault_json);
    let fault: Fault = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        AdminError::from(ValidationErrors(vec![FieldError::new(path, e.into_inner().to_string())]))
    })?;
    let ttl = match request.ttl_ms {
        0 => DEFAULT_TTL,
        ms => Duration::from_millis(ms),
    };
    let (fault, version) = faults::inject(admin.store.as_ref(), &admin.layout, fault, ttl)
        .await
        .map_err(AdminError::from)?;
    let fault_json = serde_json::to_string(&fault)
        .map_err(|e| AdminError::Corrupt { what: "fault".into(), reason: e.to_string() })?;
    Ok(Response::new(pb::InjectFaultResponse { fault_json, version }))
}

pub(super) async fn list_faults(
    admin: &AdminService,
    _request: Request<pb::ListFaultsRequest>,
) -> Result<Response<pb::ListFaultsResponse>, Status> {
    let listed =
        faults::list(admin.store.as_ref(), &admin.layout).await.map_err(AdminError::from)?;
    let faults_json = listed
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| AdminError::Corrupt { what: "fault".into(), reason: e.to_string() })?;
    Ok(Response::new(pb::ListFaultsResponse { faults_json }))
}

pub(super) async fn clear_faults(
    admin: &AdminService,
    request: Request<pb::ClearFaultsRequest>,
) -> Result<Response<pb::ClearFaultsResponse>, Status> {
    let request = request.into_inner();
    let (cleared, version) = match (request.all, request.name.is_empty()) {
        (true, true) => faults::clear_all(admin.store.as_ref(), &admin.layout).await,
        (false, false) => faults::clear(admin.store.as_ref(), &admin.layout, &request.name)
            .await
            .map(|version| (vec![request.name], version)),
        (true, false) => return Err(invalid("name", "give a name or all, not both").into()),
        (false, true) => return Err(invalid("name", "name a fault, or ask for all").into()),
    }
    .map_err(AdminError::from)?;
    Ok(Response::new(pb::ClearFaultsResponse { cleared, version }))
}
