"""plugins/module_utils/_deliver/image_sources.py, the image_sources step run as its action plugin runs it: the pin
file's pins, the archive index (manifest.json read with tarfile; the sha256 from the sidecar, else computed once and
cached by size and mtime), and the auth file's check (0600, Docker's format, never quoted)."""
import base64
import hashlib
import io
import json
import os
import tarfile

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver import image_sources as _sources

ID_A = "sha256:" + "a" * 64


def _save(path, image_hex="a" * 64, tags=("vllm/vllm-openai:v1",)):
    """A docker save archive: a layer and the manifest.json, as `docker save` writes them."""
    with tarfile.open(path, "w") as archive:
        for name, data in (("%s.json" % image_hex, b"{}"), ("layer/layer.tar", b"x" * 4096),
                           ("manifest.json", json.dumps([{"Config": "%s.json" % image_hex, "RepoTags": list(tags),
                                                          "Layers": ["layer/layer.tar"]}]).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def where(tmp_path):
    (tmp_path / "archives").mkdir()
    return tmp_path


def _args(where, **more):
    return dict({"pin_file": str(where / "image-pins.json"), "archive_dir": str(where / "archives"),
                 "archive_cache": str(where / "image-archives.json")}, **more)


def test_the_archives_are_indexed_and_their_sha256_computed_once(where, step_runner, monkeypatch):
    digest = _save(where / "archives" / "vllm.tar")
    (where / "archives" / "notes.txt").write_text("not an archive")
    status, result = step_runner("image_sources", _args(where))
    assert status == "exit" and not result["changed"] and result["pins"] == {} and result["auth_registries"] == []
    (entry,) = result["archives"]
    assert (entry["name"], entry["sha256"], entry["images"]) == \
        ("vllm.tar", digest, [{"image_id": ID_A, "repo_tags": ["vllm/vllm-openai:v1"]}])
    cached = json.loads((where / "image-archives.json").read_text())
    assert cached["archives"][entry["path"]]["sha256"] == digest
    monkeypatch.setattr(_sources, "file_sha256", lambda path: pytest.fail("hashed again: %s" % path))
    assert step_runner("image_sources", _args(where))[1]["archives"] == result["archives"]


def test_a_sidecar_gives_the_sha256_and_a_changed_archive_is_read_again(where, step_runner):
    archive = where / "archives" / "vllm.tar"
    _save(archive)
    (where / "archives" / "vllm.tar.sha256").write_text("%s  vllm.tar\n" % ("c" * 64))
    assert step_runner("image_sources", _args(where))[1]["archives"][0]["sha256"] == "c" * 64
    os.unlink(str(archive) + ".sha256")
    digest = _save(archive, "b" * 64)
    os.utime(archive, ns=(1, 1))
    (entry,) = step_runner("image_sources", _args(where))[1]["archives"]
    assert entry["sha256"] == digest and entry["images"][0]["image_id"] == "sha256:" + "b" * 64


def test_check_mode_writes_no_cache(where, step_runner):
    _save(where / "archives" / "vllm.tar")
    assert step_runner("image_sources", _args(where), check_mode=True)[0] == "exit"
    assert not (where / "image-archives.json").exists()


def test_an_archive_that_is_no_docker_save_is_refused_by_name(where, step_runner):
    (where / "archives" / "broken.tar").write_bytes(b"not a tar")
    status, result = step_runner("image_sources", _args(where))
    assert status == "fail" and result["msg"].startswith("NARWHAL_IMAGE_ARCHIVE_DIR: broken.tar: its manifest.json")


def test_the_pins_are_read_and_a_bad_pin_file_refused(where, step_runner):
    pins = {"r:1": {"image_id": ID_A, "digest": None, "source": "hosts"}}
    (where / "image-pins.json").write_text(json.dumps({"version": 1, "images": pins}))
    assert step_runner("image_sources", _args(where))[1]["pins"] == pins
    (where / "image-pins.json").write_text("{")
    status, result = step_runner("image_sources", _args(where))
    assert status == "fail" and result["msg"].startswith("%s: the pin file is not JSON" % (where / "image-pins.json"))


def test_the_auth_file_must_be_private_and_is_never_quoted(where, step_runner):
    auth = where / "auth.json"
    auth.write_text(json.dumps({"auths": {"registry.example:5000": {"auth": base64.b64encode(b"u:s3cret").decode()}}}))
    auth.chmod(0o644)
    status, result = step_runner("image_sources", _args(where, auth_file=str(auth)))
    assert status == "fail" and result["msg"] == (
        "NARWHAL_REGISTRY_AUTH_FILE: %s has mode 0644; it holds registry credentials and must be readable by its "
        "owner only: chmod 600 %s, then rerun" % (auth, auth))
    auth.chmod(0o600)
    status, result = step_runner("image_sources", _args(where, auth_file=str(auth)))
    assert status == "exit" and result["auth_registries"] == ["registry.example:5000"] and "s3cret" not in str(result)
    auth.write_text('{"auths": "s3cret"}')
    status, result = step_runner("image_sources", _args(where, auth_file=str(auth)))
    assert status == "fail" and "NARWHAL_REGISTRY_AUTH_FILE: the file is JSON" in result["msg"]
    assert "s3cret" not in result["msg"]
