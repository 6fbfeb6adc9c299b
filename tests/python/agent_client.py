"""A grpc-python client of blockjanitor-agent, run by tests/tests/grpc_python.rs (issue 13).

It uses DEFAULT channel options (no grpc.default_authority): over a unix socket gRPC's C core
then sends the percent-encoded socket path as :authority, which is what the agent must accept.
No generated code for the agent: the services and messages come from server reflection, v1 and
v1alpha, and the Agent is called through a stub built from the reflected FileDescriptorProtos.

Usage:
  agent_client.py --target unix:/run/x/agent.sock [--device loop3]
  agent_client.py --target localhost:7443 --ca ca.crt --cert client.crt --key client.key

Prints one JSON object on stdout: the health statuses, the services each reflection version
lists, the files it returned, the devices ListDevices returned, and the code Apply got. Exits
non-zero (with the reason on stderr) when a call fails in a way the test cannot judge.
"""

import argparse
import json
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2 as v1alpha_pb2

AGENT = "blockjanitor.v1.Agent"
TIMEOUT = 20


def reflection_v1_messages():
    """grpc.reflection.v1's request and response classes.

    grpcio-reflection ships only v1alpha's generated code. v1 is the same file under another
    package (same messages, fields and numbers), so its descriptor is v1alpha's, renamed.
    """
    fdp = descriptor_pb2.FileDescriptorProto()
    v1alpha_pb2.DESCRIPTOR.CopyToProto(fdp)
    fdp.name = "grpc/reflection/v1/reflection.proto"
    fdp.package = "grpc.reflection.v1"

    def rename(msg):
        for f in msg.field:
            if f.type_name.startswith(".grpc.reflection.v1alpha."):
                f.type_name = ".grpc.reflection.v1." + f.type_name[len(".grpc.reflection.v1alpha."):]
        for nested in msg.nested_type:
            rename(nested)

    for msg in fdp.message_type:
        rename(msg)
    for svc in fdp.service:
        for m in svc.method:
            m.input_type = m.input_type.replace(".v1alpha.", ".v1.")
            m.output_type = m.output_type.replace(".v1alpha.", ".v1.")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    req = message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest"))
    resp = message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse"))
    return req, resp


class Reflection:
    """One reflection version's client: list services, fetch files with their dependencies."""

    def __init__(self, channel, version):
        if version == "v1alpha":
            self.req, resp = v1alpha_pb2.ServerReflectionRequest, v1alpha_pb2.ServerReflectionResponse
        else:
            self.req, resp = reflection_v1_messages()
        self.call = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=resp.FromString,
        )

    def ask(self, **kw):
        (answer,) = list(self.call(iter([self.req(**kw)]), timeout=TIMEOUT))
        if answer.HasField("error_response"):
            raise RuntimeError(f"reflection error {answer.error_response.error_code}: {answer.error_response.error_message}")
        return answer

    def services(self):
        return sorted(s.name for s in self.ask(list_services="").list_services_response.service)

    def files_for(self, symbol):
        """FileDescriptorProtos for `symbol` and everything they import, in dependency order."""
        files = {}

        def add(blobs):
            for blob in blobs:
                fdp = descriptor_pb2.FileDescriptorProto.FromString(blob)
                files.setdefault(fdp.name, fdp)

        add(self.ask(file_containing_symbol=symbol).file_descriptor_response.file_descriptor_proto)
        missing = True
        while missing:
            missing = [d for f in list(files.values()) for d in f.dependency if d not in files]
            for name in missing:
                add(self.ask(file_by_filename=name).file_descriptor_response.file_descriptor_proto)
        ordered, seen = [], set()

        def visit(name):
            if name in seen:
                return
            seen.add(name)
            for d in files[name].dependency:
                visit(d)
            ordered.append(files[name])

        for name in sorted(files):
            visit(name)
        return ordered


class DynamicStub:
    """Calls unary methods of a service described only by reflected FileDescriptorProtos."""

    def __init__(self, channel, files, service):
        self.pool = descriptor_pool.DescriptorPool()
        for fdp in files:
            self.pool.Add(fdp)
        self.service = self.pool.FindServiceByName(service)
        self.channel = channel

    def message(self, method, **fields):
        m = self.service.FindMethodByName(method)
        return message_factory.GetMessageClass(m.input_type)(**fields)

    def call(self, method, request):
        m = self.service.FindMethodByName(method)
        out = message_factory.GetMessageClass(m.output_type)
        rpc = self.channel.unary_unary(
            f"/{self.service.full_name}/{m.name}",
            request_serializer=lambda r: r.SerializeToString(),
            response_deserializer=out.FromString,
        )
        return rpc(request, timeout=TIMEOUT)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    p.add_argument("--device", default="loop0", help="the device Apply names (refused to a viewer)")
    a = p.parse_args()

    # Default channel options: nothing overrides the authority.
    if a.ca:
        def read(path):
            with open(path, "rb") as f:
                return f.read()

        creds = grpc.ssl_channel_credentials(read(a.ca), read(a.key), read(a.cert))
        channel = grpc.secure_channel(a.target, creds)
    else:
        channel = grpc.insecure_channel(a.target)
    grpc.channel_ready_future(channel).result(timeout=TIMEOUT)

    out = {"health": {}, "reflection": {}}
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("", AGENT):
        status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=TIMEOUT).status
        out["health"][name] = health_pb2.HealthCheckResponse.ServingStatus.Name(status)

    stubs = {}
    for version in ("v1", "v1alpha"):
        r = Reflection(channel, version)
        files = r.files_for(AGENT)
        out["reflection"][version] = {"services": r.services(), "files": [f.name for f in files]}
        stubs[version] = DynamicStub(channel, files, AGENT)

    # ListDevices through each version's descriptors: both must describe the same service.
    listed = {}
    for version, stub in stubs.items():
        resp = stub.call("ListDevices", stub.message("ListDevices"))
        listed[version] = [d.name for d in resp.devices]
    out["devices"] = listed["v1"]
    out["devices_v1alpha"] = listed["v1alpha"]

    stub = stubs["v1"]
    try:
        stub.call("Apply", stub.message("Apply", devices=[a.device]))
        out["apply"] = "OK"
    except grpc.RpcError as e:
        out["apply"] = e.code().name
        out["apply_details"] = e.details()
    channel.close()
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    try:
        main()
    except grpc.RpcError as e:
        print(f"agent_client: {e.code().name}: {e.details()}", file=sys.stderr)
        sys.exit(2)
