import json
import os
import socket

import pytest

from torch_tpu.kit import cli, doctor


@pytest.fixture
def clean(monkeypatch, tmp_path):
    """No launch, Kubernetes or TORCH_TPU_* variable; cache roots and the service-account dir under tmp_path."""
    for name in list(os.environ):
        if name.startswith(("TORCH_TPU_", "PET_", "POD_", "GKE_TPU_", "TPU_")) or name in doctor.DISTRIBUTED_VARIABLES:
            monkeypatch.delenv(name)
    for name in ("KUBERNETES_SERVICE_HOST", "NODE_NAME", "SERVICE_ACCOUNT", "JAX_COMPILATION_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", str(tmp_path / "xla"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(doctor, "SERVICE_ACCOUNT_DIR", tmp_path / "serviceaccount")
    return tmp_path


def _names(report):
    return [f["name"] for f in report["findings"]]


def _check_schema(report):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(json.dumps(report)), doctor.DOCTOR_SCHEMA)


def test_clean_environment_has_no_finding_and_matches_the_schema(clean):
    report = doctor.gather()
    _check_schema(report)
    assert report["findings"] == [] and doctor.exit_code(report) == 0
    assert report["versions"]["torch"] and report["versions"]["jax"]
    assert report["platform"]["chosen"] == "cpu" and "auto" in report["platform"]["why"]
    assert report["platform"]["available"]["cpu"] >= 1 and report["devices"][0]["platform"] == "cpu"
    assert report["eager"]["mode"] == "strict"
    assert report["eager"]["switches"] == {"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": str(clean / "xla")}
    tier3 = report["caches"][0]
    assert tier3["path"] == str(clean / "xla") and tier3["exists"] is False and tier3["private"] is None
    assert report["kubernetes"]["in_pod"] is False
    text = doctor.format_text(report)
    for section in ("versions", "platform", "devices", "eager", "compile caches", "distributed", "kubernetes"):
        assert f"\n{section}\n" in f"\n{text}\n"
    assert "findings (0)" in text


def test_cache_permissions(clean, monkeypatch):
    root = clean / "xla"
    (root / "ab").mkdir(parents=True)
    (root / "ab" / "entry").write_bytes(b"x" * 100)
    root.chmod(0o700)
    info, findings = doctor.check_cache("tier3", root)
    assert (info["entries"], info["size_bytes"], info["mode"], info["private"]) == (1, 100, "0o700", True)
    assert findings == []
    root.chmod(0o777)
    report = doctor.gather()
    assert "cache_world_writable" in _names(report) and doctor.exit_code(report) == 1
    root.chmod(0o770)
    assert [f["name"] for f in doctor.check_cache("tier3", root)[1]] == ["cache_not_private"]
    root.chmod(0o700)
    if os.getuid() == 0:  # another owner: only root can make one
        os.chown(root, 4242, -1)
        assert [f["name"] for f in doctor.check_cache("tier3", root)[1]] == ["cache_not_private"]
        os.chown(root, 0, -1)
    monkeypatch.setattr(doctor.os, "access", lambda path, mode: False)  # root may write anywhere: pretend not
    assert [f["name"] for f in doctor.check_cache("tier3", clean / "absent")[1]] == ["cache_not_writable"]


@pytest.mark.parametrize(
    "env,finding",
    [
        ({"RANK": "1"}, "rank_without_world_size"),
        ({"WORLD_SIZE": "2"}, "world_size_without_rank"),
        ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": ""}, "rank_out_of_range"),
        ({"RANK": "one", "WORLD_SIZE": "2"}, "invalid_rank_variable"),
        ({"LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4"}, "local_rank_out_of_range"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "master_addr_missing"),
    ],
)
def test_distributed_variable_findings(clean, monkeypatch, env, finding):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    report = doctor.gather()
    assert finding in _names(report) and doctor.exit_code(report) == 1
    assert report["distributed"]["variables"] == env


def test_master_reachability(clean):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    with listener:
        info, findings = doctor.check_distributed(env, connect_timeout=2.0)
        assert info["master"]["reachable"] is True and findings == []
    # The port is closed now: connection refused, at once.
    info, findings = doctor.check_distributed(env, connect_timeout=2.0)
    assert info["master"]["reachable"] is False and [f["name"] for f in findings] == ["master_unreachable"]
    assert f"127.0.0.1:{port}" in findings[0]["message"]
    # Rank 0 (or node 0) is the one that listens: not probed.
    info, findings = doctor.check_distributed({**env, "RANK": "0"}, connect_timeout=2.0)
    assert info["master"]["reachable"] is None and "not checked" in info["master"]["note"] and findings == []


def test_unresolvable_master(monkeypatch):
    def fail(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(doctor.socket, "getaddrinfo", fail)
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "train-0.train"}
    _, findings = doctor.check_distributed(env, connect_timeout=0.5)
    assert [f["name"] for f in findings] == ["master_unresolvable"]


@pytest.mark.parametrize(
    "env,finding",
    [
        ({"TORCH_TPU_PLATFROM": "cpu"}, "unknown_switch"),
        ({"TORCH_TPU_LAUNCH_BLOCKING": "yes"}, "invalid_switch_value"),
        ({"TORCH_TPU_LAUNCH_BLOCKING": "1", "TORCH_TPU_DEFER_AND_FUSE": "1"}, "conflicting_eager_switches"),
        ({"TORCH_TPU_PLATFORM": "quantum"}, "invalid_platform"),
    ],
)
def test_switch_findings(clean, monkeypatch, env, finding):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    report = doctor.gather()
    assert finding in _names(report) and doctor.exit_code(report) == 1
    for name, value in env.items():
        assert report["eager"]["switches"][name] == value
    _check_schema(report)


def test_no_devices_and_unreadable_cache(clean, monkeypatch):
    from torch_tpu.runtime import platform

    def no_devices():
        raise RuntimeError("torch_tpu: no JAX devices for TORCH_TPU_PLATFORM='tpu'")

    with monkeypatch.context() as patch:
        patch.setattr(platform, "devices", no_devices)
        info, devices, findings = doctor.check_platform({})
    assert info["chosen"] is None and devices == [] and [f["name"] for f in findings] == ["no_devices"]

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(doctor.pathlib.Path, "stat", denied)
    info, findings = doctor.check_cache("tier3", clean / "xla")
    assert [f["name"] for f in findings] == ["cache_unreadable"] and info["writable"] is False


def test_plugin_without_devices(clean, monkeypatch):
    real = doctor._local_devices

    def busy(backend):
        if backend == "tpu":
            raise RuntimeError("TPU initialization failed: the TPU is already in use by process 4242\nmore")
        return real(backend)

    monkeypatch.setattr(doctor, "_local_devices", busy)
    info, _, findings = doctor.check_platform({"libtpu": "0.0.20"})
    assert info["available"]["tpu"] == 0 and "in use by process 4242" in info["errors"]["tpu"]
    (finding,) = findings
    assert finding["name"] == "plugin_without_devices" and "libtpu installed but no tpu device" in finding["message"]
    assert doctor.check_platform({})[2] == []  # no plugin installed: an absent TPU is no misconfiguration


def test_known_switches_are_read_from_the_source():
    known = doctor.known_switches()
    assert {"TORCH_TPU_PLATFORM", "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "TORCH_TPU_LAUNCH_BLOCKING"} <= known
    assert "TORCH_TPU_PLATFROM" not in known


def test_unsupported_version(clean, monkeypatch):
    real = doctor._installed
    monkeypatch.setattr(doctor, "_installed", lambda name: "2.99.0" if name == "torch" else real(name))
    report = doctor.gather()
    (finding,) = [f for f in report["findings"] if f["name"] == "unsupported_version"]
    assert "torch 2.99.0" in finding["message"] and "torch>=2.11,<2.15" in finding["fix"]


def test_kubernetes_facts_inside_a_pod(clean, monkeypatch):
    env = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "POD_NAME": "train-0-abcde",
        "POD_NAMESPACE": "ml-evaluation",
        "NODE_NAME": "gke-tpu-node-1",
        "SERVICE_ACCOUNT": "torchtpu-runner",
        "GKE_TPU_ACCELERATOR": "tpu-v5-lite-podslice",
        "GKE_TPU_TOPOLOGY": "4x4",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    report = doctor.gather()
    k = report["kubernetes"]
    assert k["in_pod"] and k["namespace"] == "ml-evaluation" and "downward API" in k["namespace_source"]
    assert k["facts"]["GKE_TPU_TOPOLOGY"] == "4x4" and k["pod"] == "train-0-abcde"
    assert "kubectl describe pod train-0-abcde -n ml-evaluation" in k["commands"]
    assert "kubectl logs train-0-abcde -n ml-evaluation --previous" in k["commands"]
    assert "kubectl get node gke-tpu-node-1 --show-labels" in k["commands"]
    assert any("system:serviceaccount:ml-evaluation:torchtpu-runner" in c for c in k["commands"])
    assert report["findings"] == []
    # A mounted API token (the pod did not set automountServiceAccountToken: false) is a finding.
    account = clean / "serviceaccount"
    account.mkdir()
    (account / "namespace").write_text("team-a\n")
    (account / "token").write_text("secret")
    report = doctor.gather()
    assert report["kubernetes"]["namespace"] == "team-a"
    assert _names(report) == ["service_account_token_mounted"]
    assert "secret" not in json.dumps(report)


def test_cli_json_and_text(clean, monkeypatch, capsys):
    assert cli.main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    _check_schema(report)
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "ERROR rank_without_world_size: RANK is set but WORLD_SIZE is not" in out and "findings (1)" in out
