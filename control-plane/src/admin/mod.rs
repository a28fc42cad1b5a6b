//! The admin API (`switchyard.admin.v1.Admin`): catalog and API keys in the store, the
//! fleet as the nodes' presence records show it, what nodes report (breaker states, the
//! failover-event audit log, usage totals), webhook deliveries, and injected faults
//! ([`crate::faults`]). One module per resource; the gRPC service below hands each call to
//! its resource's module.
//!
//! Every write is a compare-and-swap on the revision that was read, so two admins (or two
//! replicas) racing on one resource never lose an update silently: the loser gets `Aborted`.

mod breakers;
mod catalog;
mod deliveries;
mod events;
mod faults;
mod keys;
mod nodes;
mod service;
mod usage;

use tonic::{Request, Response, Status};

use switchyard_proto::admin::v1::{self as pb, admin_server::Admin};

pub use service::{AdminError, AdminService};

#[tonic::async_trait]
impl Admin for AdminService {
    type ListEventsStream = events::EventStream;

    async fn list_breakers(
        &self,
        request: Request<pb::ListBreakersRequest>,
    ) -> Result<Response<pb::ListBreakersResponse>, Status> {
        breakers::list_breakers(self, request).await
    }

    async fn list_events(
        &self,
        request: Request<pb::ListEventsRequest>,
    ) -> Result<Response<Self::ListEventsStream>, Status> {
        events::list_events(self, request).await
    }

    async fn get_usage(
        &self,
        request: Request<pb::GetUsageRequest>,
    ) -> Result<Response<pb::GetUsageResponse>, Status> {
        usage::get_usage(self, request).await
    }

    async fn apply_catalog(
        &self,
        request: Request<pb::ApplyCatalogRequest>,
    ) -> Result<Response<pb::ApplyCatalogResponse>, Status> {
        catalog::apply_catalog(self, request).await
    }

    async fn get_catalog(
        &self,
        request: Request<pb::GetCatalogRequest>,
    ) -> Result<Response<pb::GetCatalogResponse>, Status> {
        catalog::get_catalog(self, request).await
    }

    async fn create_key(
        &self,
        request: Request<pb::CreateKeyRequest>,
    ) -> Result<Response<pb::KeySecretResponse>, Status> {
        keys::create_key(self, request).await
    }

    async fn list_keys(
        &self,
        request: Request<pb::ListKeysRequest>,
    ) -> Result<Response<pb::ListKeysResponse>, Status> {
        keys::list_keys(self, request).await
    }

    async fn get_key(
        &self,
        request: Request<pb::KeyIdRequest>,
    ) -> Result<Response<pb::KeyResponse>, Status> {
        keys::get_key(self, request).await
    }

    async fn revoke_key(
        &self,
        request: Request<pb::KeyIdRequest>,
    ) -> Result<Response<pb::KeyResponse>, Status> {
        keys::revoke_key(self, request).await
    }

    async fn rotate_key(
        &self,
        request: Request<pb::KeyIdRequest>,
    ) -> Result<Response<pb::KeySecretResponse>, Status> {
        keys::rotate_key(self, request).await
    }

    async fn set_key_defaults(
        &self,
        request: Request<pb::SetKeyDefaultsRequest>,
    ) -> Result<Response<pb::KeyResponse>, Status> {
        keys::set_key_defaults(self, request).await
    }

    async fn set_key_limits(
        &self,
        request: Request<pb::SetKeyLimitsRequest>,
    ) -> Result<Response<pb::KeyResponse>, Status> {
        keys::set_key_limits(self, request).await
    }

    async fn list_deliveries(
        &self,
        request: Request<pb::ListDeliveriesRequest>,
    ) -> Result<Response<pb::ListDeliveriesResponse>, Status> {
        deliveries::list_deliveries(self, request).await
    }

    async fn redeliver(
        &self,
        request: Request<pb::RedeliverRequest>,
    ) -> Result<Response<pb::RedeliverResponse>, Status> {
        deliveries::redeliver(self, request).await
    }

    async fn inject_fault(
        &self,
        request: Request<pb::InjectFaultRequest>,
    ) -> Result<Response<pb::InjectFaultResponse>, Status> {
        faults::inject_fault(self, request).await
    }

    async fn list_faults(
        &self,
        request: Request<pb::ListFaultsRequest>,
    ) -> Result<Response<pb::ListFaultsResponse>, Status> {
        faults::list_faults(self, request).await
    }

    async fn clear_faults(
        &self,
        request: Request<pb::ClearFaultsRequest>,
    ) -> Result<Response<pb::ClearFaultsResponse>, Status> {
        faults::clear_faults(self, request).await
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        nodes::list_nodes(self, request).await
    }
}
