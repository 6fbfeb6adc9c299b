//! What every gRPC listener serves beside its own service: the health service's name, and server
//! reflection (`grpc.reflection.v1` and `v1alpha`) that advertises only the services the listener
//! really serves. Used by the agent's listeners and the fleet console's.

/// Why the reflection service could not be built (a descriptor set it could not read).
#[derive(Debug, thiserror::Error)]
#[error("reflection: {0}")]
pub struct ReflectionError(pub String);

/// The gRPC health service's name, which every listener serves beside its own.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// A reflection builder over the given encoded descriptor sets that advertises only `services`
/// (fully qualified), the services the listener really serves: a descriptor set may hold others
/// (the agent's holds the console's `Fleet`), which a client would otherwise call and get
/// UNIMPLEMENTED. Their types stay resolvable.
fn reflection_builder<'b>(sets: &[&'b [u8]], services: &[&str]) -> tonic_reflection::server::Builder<'b> {
    let b = sets.iter().fold(tonic_reflection::server::Builder::configure(), |b, s| {
        b.register_encoded_file_descriptor_set(s)
    });
    services.iter().fold(b, |b, name| b.with_service_name(*name))
}

/// Server reflection (`grpc.reflection.v1`) over the given encoded descriptor sets, advertising
/// `services` and reflection itself (its own name, as grpcurl and grpc_cli expect to see it).
pub fn reflection_v1(
    sets: &[&'static [u8]],
    services: &[&str],
) -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>,
    ReflectionError,
> {
    reflection_builder(sets, services)
        .with_service_name("grpc.reflection.v1.ServerReflection")
        .build_v1()
        .map_err(|e| ReflectionError(e.to_string()))
}

/// The same as `grpc.reflection.v1alpha`, which many clients still speak (Python's
/// `grpc_reflection`, `grpc_cli`, older grpcurl and Postman) and get UNIMPLEMENTED without.
pub fn reflection_v1alpha(
    sets: &[&'static [u8]],
    services: &[&str],
) -> Result<
    tonic_reflection::server::v1alpha::ServerReflectionServer<
        impl tonic_reflection::server::v1alpha::ServerReflection,
    >,
    ReflectionError,
> {
    reflection_builder(sets, services)
        .with_service_name("grpc.reflection.v1alpha.ServerReflection")
        .build_v1alpha()
        .map_err(|e| ReflectionError(e.to_string()))
}
