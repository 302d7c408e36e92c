"""GKE TPU manifests, hardened by default, that refuse what could never schedule.

Three shapes, all from one `JobSpec`:

- a single-host Job, the guide's (accelerator and topology node selectors, `google.com/tpu` requests = limits,
  `backoffLimit: 0` because retries would mask failures, a deadline, a TTL);
- a multi-host Job for slices spanning several TPU VMs: an Indexed Job (completions = parallelism = hosts) with
  a headless Service, each pod requesting its host's chips and starting `torchrun` with its node rank from the
  completion index and the index-0 pod's DNS name as the master address; `backoffLimit: 0` still, recovery
  being the drill's (torchrun's `--max-restarts` within the pod, the last checkpoint on a volume that outlives
  the pods);
- `serve`: a Deployment + Service with startup/readiness/liveness probes, a PodDisruptionBudget and optional
  spreading across zones.

Every one gets the same hardening: a dedicated ServiceAccount with no RBAC grants (none is generated) and an
optional Workload Identity annotation, no service-account token in the pod, non-root, read-only root filesystem
(emptyDirs for /tmp and the caches), all capabilities dropped, no privilege escalation, seccomp RuntimeDefault,
never `privileged` (GKE needs it only before 1.28), and a NetworkPolicy that denies ingress but the service port
(and, multi-host, traffic between the job's own pods) and egress but DNS and the listed destinations.
Chips per host and hosts per slice come from `tpu_slices` (GKE's tables).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import pathlib
from typing import Any

from torch_tpu.kit import tpu_slices

RENDEZVOUS_PORT = 29500  # torchrun's default MASTER_PORT
SERVE_PORT = 8080
PROBE_PATHS = {"liveness": "/healthz", "readiness": "/readyz", "metrics": "/metrics"}
WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"
# GKE's metadata server, which Workload Identity Federation needs: 169.254.169.252:988 (GKE >= 1.21) and
# 169.254.169.254:80 (Dataplane V2), per GKE's network-policy page.
METADATA_SERVER = (("169.254.169.252/32", 988), ("169.254.169.254/32", 80))
CHECKPOINT_MOUNT = "/checkpoints"
DEFAULT_STARTUP_SECONDS = 600  # the startupProbe budget when no warm-up was measured
STARTUP_MARGIN = 2.0  # budget = margin x measured warm-up: a cold node, a busier host


class ManifestError(ValueError):
    """An accelerator/topology/option combination that cannot produce a schedulable workload."""


@dataclasses.dataclass
class Serve:
    """The serving Deployment's options (`torch-tpu k8s --serve`)."""

    workload: str
    replicas: int = 2
    port: int = SERVE_PORT
    warmup_seconds: float | None = None  # measured warm-up; sizes the startupProbe
    spread_zones: bool = False
    max_unavailable: int = 1


@dataclasses.dataclass
class JobSpec:
    image: str
    accelerator: str = "tpu-v6e-slice"
    topology: str = "1x1"
    mode: str = "compiled"
    chips: int | None = None  # chips per host: picks between machine types, else a cross-check
    name: str = "torchtpu-smoke"
    namespace: str = "ml-evaluation"
    service_account: str = "torchtpu-runner"
    command: tuple[str, ...] = ("torch-tpu", "smoke", "--mode")  # single-host Job: the mode is appended
    program: tuple[str, ...] = ("-m", "torch_tpu.kit.smoke", "--mode")  # multi-host: what torchrun runs per rank
    deadline_seconds: int = 1800
    ttl_seconds: int = 86400
    cpu: tuple[str, str] = ("2", "4")
    memory: tuple[str, str] = ("8Gi", "16Gi")
    ephemeral_storage: tuple[str, str] = ("1Gi", "4Gi")
    run_as_user: int = 1000
    gcp_service_account: str | None = None  # Workload Identity: the Google service account to act as
    egress: tuple[str, ...] = ()  # allowed destinations: "CIDR" or "CIDR:PORT"
    checkpoint_claim: str | None = None  # an existing ReadWriteMany PVC; multi-host creates one when absent
    checkpoint_storage_class: str = "standard-rwx"  # GKE's Filestore class
    checkpoint_size: str = "100Gi"
    max_restarts: int = 0  # torchrun --max-restarts (multi-host)
    serve: Serve | None = None


def _shape(accelerator: str, topology: str, chips: int | None) -> tpu_slices.Shape:
    try:
        return tpu_slices.resolve(accelerator, topology, chips)
    except tpu_slices.SliceError as exc:
        raise ManifestError(str(exc)) from None


def startup_seconds_from_report(path: str | pathlib.Path, mode: str) -> float:
    """The measured warm-up in an evaluate report.json: the cold process's start-to-first-result in `mode`
    plus the compile seconds of the catalogue's other shapes (serve warms every shape before /readyz)."""
    try:
        report = json.loads(pathlib.Path(path).read_text())
        cold = report["performance"][mode]["cold"]
        seconds = float(cold["process_to_first_result_seconds"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{path}: no measured cold start for mode {mode!r} ({exc!r})") from None
    shapes = report.get("shapes") or []
    return seconds + sum(float(s.get("compile_seconds") or 0) for s in shapes[1:] if isinstance(s, dict))


def _check(spec: JobSpec) -> tpu_slices.Shape:
    if spec.mode not in ("eager", "compiled"):
        raise ManifestError(f"mode must be eager or compiled, not {spec.mode!r}")
    if not spec.image or any(c.isspace() for c in spec.image):
        raise ManifestError(f"image {spec.image!r} is not a valid image reference")
    if spec.deadline_seconds <= 0 or spec.ttl_seconds < 0:
        raise ManifestError("deadline must be positive and TTL non-negative")
    if spec.max_restarts < 0:
        raise ManifestError(f"max_restarts must be >= 0, not {spec.max_restarts}")
    shape = _shape(spec.accelerator, spec.topology, spec.chips)
    if spec.serve is not None:
        if shape.multi_host:
            single = ", ".join(s.topology for s in tpu_slices.table(shape.accelerator) if s.hosts == 1)
            raise ManifestError(
                f"topology {shape.topology} on {shape.accelerator} spans {shape.hosts} hosts; serving replicas "
                f"run on one host each: {single}"
            )
        if spec.serve.replicas < 1 or not 0 < spec.serve.port < 65536:
            raise ManifestError("serve needs at least one replica and a port in 1..65535")
        if spec.serve.warmup_seconds is not None and spec.serve.warmup_seconds < 0:
            raise ManifestError("warm-up seconds must be >= 0")
    for destination in spec.egress:
        _egress_rule(destination)
    return shape


def _egress_rule(destination: str) -> dict[str, Any]:
    cidr, _, port = destination.partition(":") if destination.count(":") == 1 else (destination, "", "")
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise ManifestError(f"egress destination {destination!r} is not CIDR or CIDR:PORT") from None
    rule: dict[str, Any] = {"to": [{"ipBlock": {"cidr": str(network)}}]}
    if port:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ManifestError(f"egress destination {destination!r} has an invalid port")
        rule["ports"] = [{"protocol": "TCP", "port": int(port)}]
    return rule


def _labels(spec: JobSpec) -> dict[str, str]:
    return {"app": spec.name, "app.kubernetes.io/part-of": "torch-tpu"}


def _meta(spec: JobSpec, name: str | None = None) -> dict[str, Any]:
    return {"name": name or spec.name, "namespace": spec.namespace, "labels": _labels(spec)}


def container_security(spec: JobSpec) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": spec.run_as_user,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env(spec: JobSpec, shape: tpu_slices.Shape) -> list[dict[str, Any]]:
    """The run's switches, writable homes for the read-only root, and the facts `torch-tpu doctor` reads
    (downward API: pod, namespace, node; the node selectors this manifest asked for)."""
    return [
        {"name": "EXECUTION_MODE", "value": spec.mode},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "XDG_CACHE_HOME", "value": "/cache"},
        {"name": "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "value": "/cache/torch_tpu/xla"},
        _field("POD_NAME", "metadata.name"),
        _field("POD_NAMESPACE", "metadata.namespace"),
        _field("NODE_NAME", "spec.nodeName"),
        _field("SERVICE_ACCOUNT", "spec.serviceAccountName"),
        {"name": "GKE_TPU_ACCELERATOR", "value": shape.accelerator},
        {"name": "GKE_TPU_TOPOLOGY", "value": shape.topology},
    ]


def _resources(spec: JobSpec, chips: int) -> dict[str, Any]:
    def side(i: int) -> dict[str, str]:
        return {
            "cpu": spec.cpu[i],
            "memory": spec.memory[i],
            "ephemeral-storage": spec.ephemeral_storage[i],
            "google.com/tpu": str(chips),
        }

    return {"requests": side(0), "limits": side(1)}


def _container(spec: JobSpec, shape: tpu_slices.Shape, command: list[str], checkpoints: bool) -> dict[str, Any]:
    mounts = [{"name": "tmp", "mountPath": "/tmp"}, {"name": "cache", "mountPath": "/cache"}]
    if checkpoints:
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
    return {
        "name": "serve" if spec.serve else "smoke" if not shape.multi_host else "worker",
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": _env(spec, shape),
        "resources": _resources(spec, shape.chips_per_host),
        "securityContext": container_security(spec),
        "volumeMounts": mounts,
    }


def _node_selector(shape: tpu_slices.Shape) -> dict[str, str]:
    selector = {
        "cloud.google.com/gke-tpu-accelerator": shape.accelerator,
        "cloud.google.com/gke-tpu-topology": shape.topology,
    }
    if tpu_slices.ambiguous(shape):  # 2x4 is one 8-chip VM or two 4-chip VMs: pin the machine type
        selector["node.kubernetes.io/instance-type"] = shape.machine_type
    return selector


def _pod_spec(spec: JobSpec, shape: tpu_slices.Shape, container: dict[str, Any], restart: str) -> dict[str, Any]:
    volumes: list[dict[str, Any]] = [
        # Writable scratch for the read-only root; the pod's ephemeral-storage limit bounds both.
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
    ]
    if any(m["name"] == "checkpoints" for m in container["volumeMounts"]):
        claim = spec.checkpoint_claim or f"{spec.name}-checkpoints"
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}})
    return {
        "serviceAccountName": spec.service_account,
        "automountServiceAccountToken": False,
        "restartPolicy": restart,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": spec.run_as_user,
            "runAsGroup": spec.run_as_user,
            "fsGroup": spec.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "nodeSelector": _node_selector(shape),
        "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
        "volumes": volumes,
    }


def _service_account(spec: JobSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": spec.service_account, "namespace": spec.namespace}
    if spec.gcp_service_account:
        meta["annotations"] = {WORKLOAD_IDENTITY_ANNOTATION: spec.gcp_service_account}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False}


def _network_policy(spec: JobSpec, shape: tpu_slices.Shape) -> dict[str, Any]:
    """Deny by default. Ingress: the serving port, or (multi-host) any port from the job's own pods — the JAX
    coordinator, gloo and the watchdog listen on ports chosen at run time. Egress: DNS (to any resolver, so
    NodeLocal DNSCache works too), the job's own pods, the metadata server when Workload Identity is on, and
    the listed destinations."""

    def peers() -> list[dict[str, Any]]:
        return [{"podSelector": {"matchLabels": {"app": spec.name}}}]

    ingress: list[dict[str, Any]] = []
    egress: list[dict[str, Any]] = [
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
    ]
    if spec.serve is not None:
        ingress.append({"ports": [{"protocol": "TCP", "port": spec.serve.port}]})
    if shape.multi_host:
        ingress.append({"from": peers()})
        egress.append({"to": peers()})
    if spec.gcp_service_account:
        egress += [
            {"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"protocol": "TCP", "port": port}]}
            for cidr, port in METADATA_SERVER
        ]
    egress += [_egress_rule(destination) for destination in spec.egress]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(spec),
        "spec": {
            "podSelector": {"matchLabels": {"app": spec.name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def _common(spec: JobSpec, shape: tpu_slices.Shape) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": spec.namespace}},
        _service_account(spec),
        _network_policy(spec, shape),
    ]


def _job(spec: JobSpec, pod: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(spec),
        "spec": {
            **extra,
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.deadline_seconds,
            "ttlSecondsAfterFinished": spec.ttl_seconds,
            "template": {"metadata": {"labels": _labels(spec)}, "spec": pod},
        },
    }


def _single_host(spec: JobSpec, shape: tpu_slices.Shape) -> list[dict[str, Any]]:
    checkpoints = spec.checkpoint_claim is not None
    container = _container(spec, shape, [*spec.command, spec.mode], checkpoints)
    return [*_common(spec, shape), _job(spec, _pod_spec(spec, shape, container, "Never"))]


def master_address(spec: JobSpec) -> str:
    """The index-0 pod's DNS name: an Indexed Job's pod is `<job>-<index>`, under the headless Service's name
    as its subdomain, so `<job>-0.<service>` resolves inside the namespace."""
    return f"{spec.name}-0.{spec.name}"


def _multi_host(spec: JobSpec, shape: tpu_slices.Shape) -> list[dict[str, Any]]:
    command = [
        "torchrun",
        f"--nnodes={shape.hosts}",
        f"--nproc-per-node={shape.chips_per_host}",
        "--node-rank=$(NODE_RANK)",
        f"--master-addr={master_address(spec)}",
        f"--master-port={RENDEZVOUS_PORT}",
        f"--max-restarts={spec.max_restarts}",
        *spec.program,
        *([spec.mode] if spec.program and spec.program[-1] == "--mode" else []),
    ]
    container = _container(spec, shape, command, checkpoints=True)
    # The node rank is the completion index, read through the downward API (defined before its use in command).
    container["env"].insert(0, _field("NODE_RANK", "metadata.annotations['batch.kubernetes.io/job-completion-index']"))
    container["env"] += [
        {"name": "MASTER_ADDR", "value": master_address(spec)},
        {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        {"name": "NNODES", "value": str(shape.hosts)},
        {"name": "NPROC_PER_NODE", "value": str(shape.chips_per_host)},
        {"name": "CHECKPOINT_DIR", "value": f"{CHECKPOINT_MOUNT}/{spec.name}"},
    ]
    container["ports"] = [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}]
    pod = _pod_spec(spec, shape, container, "Never")
    pod["subdomain"] = spec.name
    # All hosts in one node pool: a multi-host TPU node pool is exactly one slice (the first pod matches itself).
    pod["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": spec.name}},
                    "topologyKey": "cloud.google.com/gke-nodepool",
                }
            ]
        }
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # peers resolve each other before any readiness
            "selector": {"app": spec.name},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}],
        },
    }
    docs = _common(spec, shape)
    if spec.checkpoint_claim is None:
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": _meta(spec, f"{spec.name}-checkpoints"),
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": spec.checkpoint_storage_class,
                    "resources": {"requests": {"storage": spec.checkpoint_size}},
                },
            }
        )
    job = _job(spec, pod, completionMode="Indexed", completions=shape.hosts, parallelism=shape.hosts)
    return [*docs, service, job]


def startup_probe_budget(serve: Serve) -> tuple[int, int]:
    """(periodSeconds, failureThreshold) of the startupProbe: margin x the measured warm-up, else the default."""
    period = 10
    budget = DEFAULT_STARTUP_SECONDS if serve.warmup_seconds is None else serve.warmup_seconds * STARTUP_MARGIN
    return period, max(3, math.ceil(budget / period))


def _probe(path: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _serve(spec: JobSpec, shape: tpu_slices.Shape) -> list[dict[str, Any]]:
    serve = spec.serve
    assert serve is not None
    command = ["torch-tpu", "serve", serve.workload, "--mode", spec.mode, "--host", "0.0.0.0"]
    command += ["--port", str(serve.port)]
    container = _container(spec, shape, command, checkpoints=spec.checkpoint_claim is not None)
    container["ports"] = [{"name": "http", "containerPort": serve.port}]
    period, failures = startup_probe_budget(serve)
    # startup on /readyz: liveness only begins once every shape is compiled and warm, so a long compile is
    # never mistaken for a hung process.
    container["startupProbe"] = _probe(PROBE_PATHS["readiness"], period, failures)
    container["readinessProbe"] = _probe(PROBE_PATHS["readiness"], 5, 3)
    container["livenessProbe"] = _probe(PROBE_PATHS["liveness"], 10, 3)
    pod = _pod_spec(spec, shape, container, "Always")
    pod["terminationGracePeriodSeconds"] = 60  # SIGTERM drains in-flight requests
    selector = {"matchLabels": {"app": spec.name}}
    if serve.spread_zones:
        pod["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": selector,
            }
        ]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec),
        "spec": {
            "replicas": serve.replicas,
            "selector": selector,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": _labels(spec)}, "spec": pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec),
        "spec": {
            "type": "ClusterIP",
            "selector": {"app": spec.name},
            "ports": [{"name": "http", "port": serve.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(spec),
        "spec": {"maxUnavailable": serve.max_unavailable, "selector": selector},
    }
    return [*_common(spec, shape), deployment, service, budget]


def build(spec: JobSpec) -> list[dict[str, Any]]:
    """The manifests as plain dicts, in apply order."""
    shape = _check(spec)
    if spec.serve is not None:
        return _serve(spec, shape)
    return _multi_host(spec, shape) if shape.multi_host else _single_host(spec, shape)


def render(spec: JobSpec) -> str:
    """YAML documents separated by '---', ready for `kubectl apply -f -` (JSON, itself YAML, without PyYAML)."""
    documents = build(spec)
    try:
        import yaml
    except ImportError:
        return "---\n".join(json.dumps(d, indent=2) + "\n" for d in documents)
    return yaml.safe_dump_all(documents, sort_keys=False)


_MODELS = {
    "Namespace": "V1Namespace",
    "ServiceAccount": "V1ServiceAccount",
    "NetworkPolicy": "V1NetworkPolicy",
    "PersistentVolumeClaim": "V1PersistentVolumeClaim",
    "Service": "V1Service",
    "Job": "V1Job",
    "Deployment": "V1Deployment",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
}


def validate(documents: list[dict[str, Any]]) -> None:
    """Check each manifest against the Kubernetes API models (needs the `kubernetes` client).

    Deserializing into V1Job etc. enforces types and required fields; serializing back and comparing catches
    what deserializing silently drops (a misspelled or unknown field).
    """
    from kubernetes.client import ApiClient

    client = ApiClient()
    for document in map(_quantities_as_strings, documents):
        kind = document.get("kind")
        if kind not in _MODELS:
            raise ManifestError(f"unexpected kind {kind!r}")
        try:
            model = client._ApiClient__deserialize(document, _MODELS[kind])  # type: ignore[attr-defined]
        except Exception as exc:  # the client's own validation error types vary between releases
            raise ManifestError(f"{kind} does not match the Kubernetes API schema: {exc}") from exc
        round_trip = client.sanitize_for_serialization(model)
        if round_trip != document:
            found = _diff(document, round_trip)
            if found:
                raise ManifestError(f"{kind} has fields the Kubernetes API does not know: {found}")


def _quantities_as_strings(node: Any, key: str = "") -> Any:
    """A copy with numeric resource quantities as strings: the API takes `google.com/tpu: 1` (the guide's
    YAML) as the quantity "1", while the client's models accept only strings."""
    if isinstance(node, dict):
        if key in ("requests", "limits"):
            return {k: str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for k, v in node.items()}
        return {k: _quantities_as_strings(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_quantities_as_strings(item) for item in node]
    return node


def _diff(expected: Any, actual: Any, path: str = "") -> str:
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in expected:
            if key not in actual:
                return f"{path}.{key}"
            found = _diff(expected[key], actual[key], f"{path}.{key}")
            if found:
                return found
        return ""
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{path} (length {len(expected)} != {len(actual)})"
        for index, (e, a) in enumerate(zip(expected, actual, strict=True)):
            found = _diff(e, a, f"{path}[{index}]")
            if found:
                return found
        return ""
    return "" if expected == actual else f"{path} ({expected!r} != {actual!r})"
