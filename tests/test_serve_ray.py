"""Scale-out on Ray: the server as 2 Ray Serve replicas on a local Ray instance, answering through Ray's HTTP proxy
like the plain server, and a file translated by Ray Data actors in input order; both against `OrtTranslator`."""

from __future__ import annotations

import pytest

from tests.onnx_helpers import SENTENCES, trained_export_dir
from tests.serve_helpers import free_port, wait_ready
from vanilla_transformer_ort import OrtTranslator
from vanilla_transformer_ort.serve.settings import ServeSettings

ray = pytest.importorskip("ray", reason="the ray extra is not installed")


@pytest.fixture(scope="module")
def local_ray():
    # Logical CPUs: room for 2 replicas, then 2 Ray Data actors beside its read tasks (Ray does not oversubscribe).
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    from ray import serve

    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def oracle() -> OrtTranslator:
    return OrtTranslator(trained_export_dir(), provider="cpu", intra_op_num_threads=1)


def test_two_replicas_serve_the_api(local_ray, oracle):
    import httpx
    from ray import serve

    from vanilla_transformer_ort.serve.ray_serve import DEPLOYMENT_NAME, run_ray_serve

    port = free_port()
    run_ray_serve(
        [f"en-de={trained_export_dir()}"],
        ServeSettings(threads=1),
        replicas=2,
        port=port,
        cpus_per_replica=0.5,
        block=False,
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, timeout=120)
    status = serve.status().applications["vt_serve"].deployments[DEPLOYMENT_NAME]
    assert status.replica_states.get("RUNNING") == 2
    answers = [
        httpx.post(f"{url}/translate", json={"q": text, "source": "en", "target": "de"}, timeout=60)
        for text in SENTENCES * 2
    ]
    assert [a.json()["translatedText"] for a in answers] == [oracle.translate([t])[0].strip() for t in SENTENCES * 2]
    batch = httpx.post(f"{url}/translate", data={"q": "a b", "source": "auto", "target": "de"}, timeout=60)
    assert batch.json()["detectedLanguage"]["language"] == "en"
    bad = httpx.post(f"{url}/translate", json={"q": 3, "source": "en", "target": "de"}, timeout=60)
    assert bad.status_code == 400 and "error" in bad.json()
    # a translated file would wait on one replica while the proxy may route its download to the other
    assert httpx.get(f"{url}/frontend/settings", timeout=60).json()["filesTranslation"] is False
    upload = httpx.post(
        f"{url}/translate_file", data={"source": "en", "target": "de"}, files={"file": ("a.txt", b"a b")}, timeout=60
    )
    assert upload.status_code == 403 and "disabled" in upload.json()["error"]
    serve.shutdown()  # gives the replicas' CPUs back to the Ray Data test


def test_ray_data_translates_a_file_in_order(local_ray, oracle, tmp_path):
    from vanilla_transformer_ort.bulk_ray import translate_file_with_ray

    lines = [*SENTENCES, "", "a b", *SENTENCES[::-1]] * 3
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n")
    target = tmp_path / "out.txt"
    count = translate_file_with_ray(trained_export_dir(), source, target, concurrency=2, batch_size=4)
    expected = [oracle.translate([line])[0].strip() if line else "" for line in lines]
    assert count == len(lines)
    assert target.read_text().split("\n")[:-1] == expected
