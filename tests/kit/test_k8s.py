import json
import math

import pytest

from torch_tpu.kit import cli, k8s, tpu_slices

pytest.importorskip("kubernetes")

IMAGE = "us-docker.pkg.dev/p/ml/img:1"

# The guide's Job (shared/seeds/torchtpu-smoke.yaml), the fields the kit's single-host Job must keep.
SEED_JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "torchtpu-smoke", "namespace": "ml-evaluation"},
    "spec": {
        "backoffLimit": 0,
        "activeDeadlineSeconds": 1800,
        "ttlSecondsAfterFinished": 86400,
        "template": {
            "metadata": {"labels": {"app": "torchtpu-smoke"}},
            "spec": {
                "serviceAccountName": "torchtpu-runner",
                "automountServiceAccountToken": False,
                "restartPolicy": "Never",
                "nodeSelector": {
                    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                    "cloud.google.com/gke-tpu-topology": "1x1",
                },
                "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [
                    {
                        "name": "smoke",
                        "image": "us-central1-docker.pkg.dev/example-project/ml/torchtpu-smoke:validated",
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["python", "/app/smoke.py"],
                        "env": [
                            {"name": "EXECUTION_MODE", "value": "compiled"},
                            {"name": "PYTHONUNBUFFERED", "value": "1"},
                        ],
                        "resources": {
                            "requests": {"cpu": "2", "memory": "8Gi", "ephemeral-storage": "1Gi", "google.com/tpu": 1},
                            "limits": {"cpu": "4", "memory": "16Gi", "ephemeral-storage": "4Gi", "google.com/tpu": 1},
                        },
                    }
                ],
            },
        },
    },
}


def _kind(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, [d["kind"] for d in docs]
    return found[0]


def _workload(docs):
    return next(d for d in docs if d["kind"] in ("Job", "Deployment"))


def _pod(docs):
    return _workload(docs)["spec"]["template"]["spec"]


def _env(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _contains(ours, seed, path=""):
    """Every field of `seed` is in `ours` with the same value (lists: each seed item is in ours)."""
    if isinstance(seed, dict):
        for key, value in seed.items():
            assert key in ours, f"{path}.{key} missing"
            _contains(ours[key], value, f"{path}.{key}")
    elif isinstance(seed, list) and seed and isinstance(seed[0], dict) and "name" in seed[0]:
        by_name = {item["name"]: item for item in ours}
        for item in seed:
            _contains(by_name[item["name"]], item, f"{path}[{item['name']}]")
    elif isinstance(seed, list):
        assert len(ours) == len(seed), path
        for i, (o, s) in enumerate(zip(ours, seed, strict=True)):
            _contains(o, s, f"{path}[{i}]")
    else:
        assert str(ours) == str(seed), f"{path}: {ours!r} != {seed!r}"


def test_single_host_job_keeps_every_field_of_the_guides_seed():
    k8s.validate([SEED_JOB])  # the seed itself passes the validator
    docs = k8s.build(k8s.JobSpec(image=SEED_JOB["spec"]["template"]["spec"]["containers"][0]["image"]))
    job = _kind(docs, "Job")
    seed = json.loads(json.dumps(SEED_JOB))
    seed["spec"]["template"]["spec"]["containers"][0].pop("command")  # ours runs the kit's smoke, same protocol
    _contains(job, seed)
    assert _pod(docs)["containers"][0]["command"] == ["torch-tpu", "smoke", "--mode", "compiled"]


@pytest.mark.parametrize(
    "accelerator,topology,chips",
    [
        ("tpu-v6e-slice", "1x1", 1),
        ("tpu-v6e-slice", "2x4", 8),
        ("tpu-v5-lite-podslice", "2x2", 4),
        ("tpu-v5p-slice", "2x2x1", 4),
        ("tpu-v4-podslice", "2x2x1", 4),
    ],
)
def test_single_host_manifest_validates_against_the_kubernetes_api(accelerator, topology, chips):
    docs = k8s.build(k8s.JobSpec(image=IMAGE, accelerator=accelerator, topology=topology))
    k8s.validate(docs)
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "NetworkPolicy", "Job"]
    job = _kind(docs, "Job")
    pod = _pod(docs)
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] > 0
    assert "completionMode" not in job["spec"] and pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
        **({"node.kubernetes.io/instance-type": "ct6e-standard-8t"} if topology == "2x4" else {}),
    }
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["google.com/tpu"] == resources["limits"]["google.com/tpu"] == str(chips)


def _specs():
    return {
        "single-host": k8s.JobSpec(image=IMAGE),
        "multi-host": k8s.JobSpec(image=IMAGE, accelerator="tpu-v5-lite-podslice", topology="4x4"),
        "serve": k8s.JobSpec(image=IMAGE, serve=k8s.Serve("examples.workloads:mlp")),
    }


@pytest.mark.parametrize("shape", ["single-host", "multi-host", "serve"])
def test_every_manifest_is_hardened(shape):
    spec = _specs()[shape]
    docs = k8s.build(spec)
    k8s.validate(docs)
    kinds = [d["kind"] for d in docs]
    assert not {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"} & set(kinds)  # no RBAC grants
    account = _kind(docs, "ServiceAccount")
    assert account["metadata"]["name"] == spec.service_account and account["automountServiceAccountToken"] is False
    assert "annotations" not in account["metadata"]
    pod = _pod(docs)
    assert pod["serviceAccountName"] == spec.service_account and pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    # The read-only root: every directory the process writes is an emptyDir mount.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = _env(container)
    for variable in ("HOME", "XDG_CACHE_HOME", "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"):
        root = next(path for path in mounts if env[variable].startswith(path))
        assert volumes[mounts[root]] == {"name": mounts[root], "emptyDir": {}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # NetworkPolicy: deny by default, DNS out, the service port (serve) or the job's own pods (multi-host) in.
    policy = _kind(docs, "NetworkPolicy")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app": spec.name}}
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["egress"][0] == {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    peers = [{"podSelector": {"matchLabels": {"app": spec.name}}}]
    if shape == "single-host":
        assert policy["ingress"] == [] and policy["egress"][1:] == []
    elif shape == "serve":
        assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080}]}] and policy["egress"][1:] == []
    else:
        assert policy["ingress"] == [{"from": peers}] and policy["egress"][1:] == [{"to": peers}]


def test_workload_identity_and_listed_egress():
    spec = k8s.JobSpec(
        image=IMAGE,
        gcp_service_account="runner@proj.iam.gserviceaccount.com",
        egress=("199.36.153.8/30:443", "10.20.0.0/16"),
    )
    docs = k8s.build(spec)
    k8s.validate(docs)
    assert _kind(docs, "ServiceAccount")["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "runner@proj.iam.gserviceaccount.com"
    }
    egress = _kind(docs, "NetworkPolicy")["spec"]["egress"]
    assert egress[1:] == [
        {"to": [{"ipBlock": {"cidr": "169.254.169.252/32"}}], "ports": [{"protocol": "TCP", "port": 988}]},
        {"to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}], "ports": [{"protocol": "TCP", "port": 80}]},
        {"to": [{"ipBlock": {"cidr": "199.36.153.8/30"}}], "ports": [{"protocol": "TCP", "port": 443}]},
        {"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}]},
    ]
    for bad in ("example.com", "10.0.0.0/8:99999"):
        with pytest.raises(k8s.ManifestError, match="egress destination"):
            k8s.build(k8s.JobSpec(image=IMAGE, egress=(bad,)))


@pytest.mark.parametrize(
    "accelerator,topology,chips,hosts,per_host,machine",
    [
        ("tpu-v5-lite-podslice", "4x4", None, 4, 4, "ct5lp-hightpu-4t"),
        ("v6e", "2x4", 4, 2, 4, "ct6e-standard-4t"),
        ("tpu-v5p-slice", "2x2x2", None, 2, 4, "ct5p-hightpu-4t"),
        ("v4", "4x4x4", None, 16, 4, "ct4p-hightpu-4t"),
    ],
)
def test_multi_host_is_an_indexed_job_with_a_headless_service(accelerator, topology, chips, hosts, per_host, machine):
    spec = k8s.JobSpec(
        image=IMAGE, accelerator=accelerator, topology=topology, chips=chips, name="train", max_restarts=2
    )
    docs = k8s.build(spec)
    k8s.validate(docs)
    assert [d["kind"] for d in docs] == [
        "Namespace",
        "ServiceAccount",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "Service",
        "Job",
    ]
    job = _kind(docs, "Job")["spec"]
    assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == hosts
    assert job["backoffLimit"] == 0
    pod = _pod(docs)
    service = _kind(docs, "Service")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert pod["subdomain"] == service["metadata"]["name"] == "train"
    assert service["spec"]["selector"] == {"app": "train"}
    selector = pod["nodeSelector"]
    assert selector["cloud.google.com/gke-tpu-accelerator"] == tpu_slices.generation(accelerator).accelerator
    assert selector["cloud.google.com/gke-tpu-topology"] == topology
    assert selector.get("node.kubernetes.io/instance-type", machine) == machine
    assert ("node.kubernetes.io/instance-type" in selector) == (topology == "2x4")
    (container,) = pod["containers"]
    resources = container["resources"]
    assert resources["requests"]["google.com/tpu"] == resources["limits"]["google.com/tpu"] == str(per_host)
    command = container["command"]
    assert command[:8] == [
        "torchrun",
        f"--nnodes={hosts}",
        f"--nproc-per-node={per_host}",
        "--node-rank=$(NODE_RANK)",
        "--master-addr=train-0.train",  # the index-0 pod under the headless service
        "--master-port=29500",
        "--max-restarts=2",
        "-m",
    ]
    # $(NODE_RANK) expands only from a variable defined earlier in env: the completion index, via the downward API.
    assert container["env"][0] == {
        "name": "NODE_RANK",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}},
    }
    env = _env(container)
    assert env["MASTER_ADDR"] == "train-0.train" and env["NNODES"] == str(hosts)
    # Checkpoints and results on a ReadWriteMany volume that outlives the pods.
    claim = _kind(docs, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in container["volumeMounts"]
    assert env["CHECKPOINT_DIR"].startswith("/checkpoints/")
    # All hosts in one node pool (= one slice).
    (affinity,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert affinity["topologyKey"] == "cloud.google.com/gke-nodepool"


def test_multi_host_uses_an_existing_claim_and_a_given_program():
    spec = k8s.JobSpec(image=IMAGE, accelerator="v5p", topology="2x2x4", checkpoint_claim="ckpt", program=("train.py",))
    docs = k8s.build(spec)
    k8s.validate(docs)
    assert "PersistentVolumeClaim" not in [d["kind"] for d in docs]
    pod = _pod(docs)
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod["volumes"]
    assert pod["containers"][0]["command"][-1] == "train.py"


def test_each_generations_table_is_consistent_with_gkes_values():
    documented = {  # (accelerator, topology, chips per host) -> hosts, from the pages tpu_slices cites
        ("v6e", "1x1", 1): 1,
        ("v6e", "2x2", 4): 1,
        ("v6e", "2x4", 8): 1,
        ("v6e", "2x4", 4): 2,
        ("v6e", "16x16", 4): 64,
        ("v5e", "4x4", 4): 4,
        ("v5litepod", "8x16", 4): 32,
        ("v5p", "2x2x1", 4): 1,
        ("v5p", "2x2x2", 4): 2,
        ("v5p", "16x16x24", 4): 1536,
        ("v4", "2x4x4", 4): 8,
    }
    for (accelerator, topology, per_host), hosts in documented.items():
        shape = tpu_slices.resolve(accelerator, topology, per_host)
        assert (shape.hosts, shape.chips_per_host) == (hosts, per_host), (accelerator, topology)
    for generation in tpu_slices.GENERATIONS:
        for shape in tpu_slices.table(generation.accelerator):
            sides = [int(s) for s in shape.topology.split("x")]
            assert len(sides) == generation.dims
            assert shape.hosts * shape.chips_per_host == math.prod(sides) == shape.chips
            assert shape.chips_per_host in (1, 4, 8)
    assert tpu_slices.resolve("v6e", "2x4").hosts == 1  # the single-host machine type is the default
    assert tpu_slices.resolve("v4", "8x8x12").hosts == 192  # GKE's general {A}x{B}x{C} rule


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"accelerator": "tpu-v9-imaginary"}, "unknown accelerator.*tpu-v6e-slice"),
        ({"topology": "2x2x2"}, "2 dimensions.*1x1, 2x2, 2x4, 4x4"),
        ({"topology": "3x3"}, "not offered.*offered: 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"),
        ({"accelerator": "v4", "topology": "4x4x6"}, "not offered.*multiple of 4 up to 4096"),
        ({"accelerator": "v5p", "topology": "8x8x4"}, "not offered.*A<=B<=C"),
        ({"topology": "2x2", "chips": 1}, "4 .*chip"),
        ({"topology": "2x4", "chips": 2}, "8 \\(ct6e-standard-8t, 1 host\\(s\\)\\) or 4 \\(ct6e-standard-4t, 2"),
        ({"mode": "turbo"}, "eager or compiled"),
        ({"image": "two words"}, "image"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"topology": "4x4", "serve": k8s.Serve("w:f")}, "spans 4 hosts.*1x1, 2x2, 2x4"),
        ({"serve": k8s.Serve("w:f", replicas=0)}, "replica"),
    ],
)
def test_invalid_combinations_are_refused_naming_the_valid_ones(kwargs, message):
    with pytest.raises(k8s.ManifestError, match=message):
        k8s.build(k8s.JobSpec(**{"image": "img:1", **kwargs}))


def test_serve_deployment_probes_budget_and_spread():
    spec = k8s.JobSpec(image=IMAGE, name="mlp", serve=k8s.Serve("examples.workloads:mlp", warmup_seconds=95))
    docs = k8s.build(spec)
    k8s.validate(docs)
    assert [d["kind"] for d in docs] == [
        "Namespace",
        "ServiceAccount",
        "NetworkPolicy",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    ]
    deployment = _kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = _pod(docs)
    assert pod["restartPolicy"] == "Always" and "topologySpreadConstraints" not in pod
    (container,) = pod["containers"]
    assert container["command"] == ["torch-tpu", "serve", "examples.workloads:mlp", "--mode", "compiled"] + [
        "--host",
        "0.0.0.0",
        "--port",
        "8080",
    ]
    assert container["ports"] == [{"name": "http", "containerPort": 8080}]
    startup, ready, live = container["startupProbe"], container["readinessProbe"], container["livenessProbe"]
    assert startup["httpGet"] == {"path": "/readyz", "port": "http"} == ready["httpGet"]
    assert live["httpGet"] == {"path": "/healthz", "port": "http"}
    # The startup budget covers twice the measured warm-up: liveness cannot kill a replica while it compiles.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 2 * 95
    assert startup["periodSeconds"] * (startup["failureThreshold"] - 1) < 2 * 95
    service = _kind(docs, "Service")["spec"]
    assert service["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert service["selector"] == {"app": "mlp"}
    budget = _kind(docs, "PodDisruptionBudget")["spec"]
    assert budget == {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "mlp"}}}
    unmeasured = k8s.build(k8s.JobSpec(image=IMAGE, serve=k8s.Serve("w:f", spread_zones=True)))
    probe = _pod(unmeasured)["containers"][0]["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] == k8s.DEFAULT_STARTUP_SECONDS
    (spread,) = _pod(unmeasured)["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone" and spread["maxSkew"] == 1


def test_warmup_comes_from_an_evaluate_report(tmp_path):
    report = {
        "performance": {"compiled": {"cold": {"process_to_first_result_seconds": 40.0}}},
        "shapes": [{"compile_seconds": 30.0}, {"compile_seconds": 12.5}, {"compile_seconds": None}],
    }
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    assert k8s.startup_seconds_from_report(path, "compiled") == 52.5  # the first shape is the cold start's
    with pytest.raises(k8s.ManifestError, match="no measured cold start for mode 'eager'"):
        k8s.startup_seconds_from_report(path, "eager")


def test_unknown_field_is_caught_by_round_trip():
    docs = k8s.build(k8s.JobSpec(image="img:1"))
    _pod(docs)["containers"][0]["securityContxt"] = {}
    with pytest.raises(k8s.ManifestError, match="securityContxt"):
        k8s.validate(docs)


def test_wrong_type_is_caught_by_the_schema():
    docs = k8s.build(k8s.JobSpec(image="img:1"))
    _kind(docs, "Job")["spec"]["backoffLimit"] = "zero"
    with pytest.raises(k8s.ManifestError, match="schema"):
        k8s.validate(docs)


def test_cli_prints_yaml_and_refuses_with_a_message(capsys, tmp_path):
    yaml = pytest.importorskip("yaml")
    base = ["k8s", "--image", "img:1"]
    assert cli.main([*base, "--accelerator", "tpu-v6e-slice", "--topology", "1x1", "--mode", "compiled"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    k8s.validate(docs)
    assert _pod(docs)["containers"][0]["command"][-1] == "compiled"
    assert cli.main([*base, "--accelerator", "v5e", "--topology", "4x4", "--egress", "10.0.0.0/8:443"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    k8s.validate(docs)
    assert _kind(docs, "Job")["spec"]["completions"] == 4
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"performance": {"compiled": {"cold": {"process_to_first_result_seconds": 30}}}}))
    args = [*base, "--serve", "--workload", "w:f", "--warmup-from-report", str(report), "--spread-zones"]
    assert cli.main(args) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    k8s.validate(docs)
    assert _pod(docs)["containers"][0]["startupProbe"]["failureThreshold"] == 6  # 2 x 30 s in 10 s periods
    assert _kind(docs, "Deployment")["metadata"]["name"] == "torchtpu-serve"
    assert cli.main([*base, "--topology", "9x9"]) == 2
    assert "not offered" in capsys.readouterr().err
    assert cli.main([*base, "--serve"]) == 2
    assert "--workload" in capsys.readouterr().err
