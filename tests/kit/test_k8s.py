import pytest

from torch_tpu.kit import cli, k8s

pytest.importorskip("kubernetes")


def _job(docs):
    return next(d for d in docs if d["kind"] == "Job")


@pytest.mark.parametrize(
    "accelerator,topology,chips",
    [
        ("tpu-v6e-slice", "1x1", 1),
        ("tpu-v6e-slice", "2x4", 8),
        ("tpu-v5-lite-podslice", "2x2", 4),
        ("tpu-v5p-slice", "2x2x1", 4),
    ],
)
def test_manifest_validates_against_the_kubernetes_api(accelerator, topology, chips):
    docs = k8s.build(k8s.JobSpec(image="us-docker.pkg.dev/p/ml/img:1", accelerator=accelerator, topology=topology))
    k8s.validate(docs)
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount", "Job"]
    job = _job(docs)
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] > 0
    assert job["spec"]["ttlSecondsAfterFinished"] >= 0
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
    }
    resources = container["resources"]
    assert resources["requests"]["google.com/tpu"] == resources["limits"]["google.com/tpu"] == str(chips)
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False and security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_unknown_field_is_caught_by_round_trip():
    docs = k8s.build(k8s.JobSpec(image="img:1"))
    _job(docs)["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(k8s.ManifestError, match="securityContxt"):
        k8s.validate(docs)


def test_wrong_type_is_caught_by_the_schema():
    docs = k8s.build(k8s.JobSpec(image="img:1"))
    _job(docs)["spec"]["backoffLimit"] = "zero"
    with pytest.raises(k8s.ManifestError, match="schema"):
        k8s.validate(docs)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"accelerator": "tpu-v9-imaginary"}, "unknown accelerator"),
        ({"topology": "2x2x2"}, "2 dimensions"),
        ({"topology": "3x3"}, "not offered"),
        ({"topology": "4x4"}, "multi-host"),
        ({"topology": "2x2", "chips": 1}, "4 chip"),
        ({"mode": "turbo"}, "eager or compiled"),
    ],
)
def test_invalid_combinations_are_refused(kwargs, message):
    with pytest.raises(k8s.ManifestError, match=message):
        k8s.build(k8s.JobSpec(image="img:1", **kwargs))


def test_cli_prints_yaml_and_refuses_with_a_message(capsys):
    yaml = pytest.importorskip("yaml")
    assert (
        cli.main(
            ["k8s", "--image", "img:1", "--accelerator", "tpu-v6e-slice", "--topology", "1x1", "--mode", "compiled"]
        )
        == 0
    )
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    k8s.validate(docs)
    assert _job(docs)["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "compiled"
    assert cli.main(["k8s", "--image", "img:1", "--topology", "9x9"]) == 2
    assert "not offered" in capsys.readouterr().err
