"""plugins/module_utils/_deliver/images.py: a reference's parts as Docker reads them, the X-Registry-Auth value of a
config.json (and its refusals, which never quote the file), the words of a failed pull, the pin file, the archive
manifest and sidecar, and the image plan - every pin rule, every host action and every refusal."""
import base64
import json

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver import images as _images

REG = "registry.example:5000"
REF = REG + "/vllm/vllm-openai:v0.33.0"
ID_A, ID_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
DIGEST_A = REG + "/vllm/vllm-openai@sha256:" + "1" * 64
DIGEST_B = REG + "/vllm/vllm-openai@sha256:" + "2" * 64


# ------------------------------------------------------------------------------------------------ references

@pytest.mark.parametrize("text, registry, path, tag, digest", [
    ("ubuntu", "docker.io", "library/ubuntu", "latest", None),
    ("vllm/vllm-openai:v0.33.0", "docker.io", "vllm/vllm-openai", "v0.33.0", None),
    ("docker.io/ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
    ("index.docker.io/library/ubuntu", "docker.io", "library/ubuntu", "latest", None),
    (REF, REG, "vllm/vllm-openai", "v0.33.0", None),
    ("localhost/img", "localhost", "img", "latest", None),
    ("localhost:5000/a/b:c", "localhost:5000", "a/b", "c", None),
    ("[fd00::1]:5000/img:t", "[fd00::1]:5000", "img", "t", None),
    (DIGEST_A, REG, "vllm/vllm-openai", None, "sha256:" + "1" * 64),
    (REF + "@sha256:" + "1" * 64, REG, "vllm/vllm-openai", "v0.33.0", "sha256:" + "1" * 64),
])
def test_a_reference_parses_as_docker_reads_it(text, registry, path, tag, digest):
    parts = _images.parse_reference(text)
    assert (parts["id"], parts["registry"], parts["path"], parts["tag"], parts["digest"]) == \
        (None, registry, path, tag, digest)
    assert parts["repository"] == registry + "/" + path


def test_an_image_id_is_no_repository():
    assert _images.parse_reference(ID_A)["id"] == ID_A
    assert _images.parse_reference("a" * 64)["id"] == ID_A
    with pytest.raises(ValueError):
        _images.parse_reference("img@sha256:abc")


def test_the_repo_digest_and_tag_of_the_references_repository():
    digests = ["other/img@sha256:" + "3" * 64, DIGEST_A]
    assert _images.repo_digest(REF, digests) == DIGEST_A
    assert _images.repo_digest(REF, ["other/img@sha256:" + "3" * 64]) is None
    assert _images.repo_digest("ubuntu:22.04", ["ubuntu@sha256:" + "4" * 64]) == "ubuntu@sha256:" + "4" * 64
    assert _images.tags_reference("docker.io/library/ubuntu:22.04", ["ubuntu:22.04"])
    assert not _images.tags_reference("ubuntu:22.04", ["ubuntu:24.04"])
    assert not _images.tags_reference(DIGEST_A, [REF])


# ------------------------------------------------------------------------------------------------ registry auth

def _config(auths, **more):
    return json.dumps(dict({"auths": auths}, **more))


def _decoded(value):
    return json.loads(base64.urlsafe_b64decode(value.encode()))


def test_the_auth_value_is_the_registrys_entry_as_the_cli_sends_it():
    text = _config({"https://" + REG: {"auth": base64.b64encode(b"narwhal:s3cret-pass").decode()},
                    "https://index.docker.io/v1/": {"username": "hub", "password": "hub-pass"}})
    assert _decoded(_images.registry_auth(text, REG)) == {"username": "narwhal", "password": "s3cret-pass",
                                                          "serveraddress": REG}
    assert _decoded(_images.registry_auth(text, "docker.io")) == {"username": "hub", "password": "hub-pass",
                                                                  "serveraddress": _images.HUB_SERVER}
    assert _images.registry_auth(text, "other.example") is None  # anonymous
    assert _images.auth_registries(text) == ["docker.io", REG]


@pytest.mark.parametrize("text, words", [
    ('{"auths": {"r": {"auth": "s3cret-not-json', "is not JSON (line 1"),
    ('["s3cret-list"]', "not Docker's config.json format"),
    (_config({}, credsStore="desktop"), "credential helper"),
    (_config({REG: {"auth": base64.b64encode(b"s3cret-no-colon").decode()}}), "not the base64 of user:password"),
    (_config({REG: {"auth": "!!s3cret!!"}}), "not the base64 of user:password"),
    (_config({REG: {"username": "u"}}), "needs both"),
    (_config({REG: {}}), "holds no credentials"),
    (_config({REG: "s3cret-string"}), "is not an object"),
])
def test_a_malformed_auth_file_is_refused_by_its_key_never_quoted(text, words):
    with pytest.raises(InputError) as info:
        _images.registry_auth(text, REG)
    assert str(info.value).startswith("NARWHAL_REGISTRY_AUTH_FILE: ") and words in str(info.value)
    assert "s3cret" not in str(info.value)


# ------------------------------------------------------------------------------------------------ failed pulls

@pytest.mark.parametrize("message, authenticated, fix", [
    ('Head "https://%s/v2/vllm/vllm-openai/manifests/v0.33.0": no basic auth credentials' % REG, False,
     "none were sent: set NARWHAL_REGISTRY_AUTH_FILE"),
    ("unauthorized: authentication required", True, "refused the credentials of NARWHAL_REGISTRY_AUTH_FILE"),
    ('Get "https://%s/v2/": tls: failed to verify certificate: x509: certificate signed by unknown authority' % REG,
     True, "set NARWHAL_REGISTRY_CA_FILE to that CA's PEM certificate (installed as /etc/docker/certs.d/%s/ca.crt)"
     % REG),
    ("manifest for %s not found: manifest unknown: manifest unknown" % REF, True,
     "has no image %s: correct NARWHAL_IMAGE" % REF),
    ('Get "https://%s/v2/": dial tcp 10.0.0.9:5000: connect: connection refused' % REG, False,
     "cannot reach the registry: check that %s (from NARWHAL_IMAGE)" % REG),
    ("lookup registry.example: no such host", False, "cannot reach the registry"),
    ("something else", False, "journalctl -u docker"),
])
def test_a_failed_pull_names_the_input_that_fixes_it(message, authenticated, fix):
    text = _images.pull_failure(message, "engine-2", REF, REG, "NARWHAL_IMAGE", authenticated)
    assert text.startswith("engine-2: pulling %s (NARWHAL_IMAGE) from registry %s failed: %s" % (REF, REG, message))
    assert fix in text


# ------------------------------------------------------------------------------------------------ pin file, archives

def test_the_pin_file_is_the_same_bytes_for_the_same_pins_and_reads_back():
    pins = {REF: {"image_id": ID_A, "digest": DIGEST_A, "source": "registry"},
            "b:1": {"image_id": ID_B, "digest": None, "source": "archive"}}
    text = _images.pin_text(pins)
    assert text == _images.pin_text(dict(reversed(list(pins.items()))))
    assert json.loads(text) == {"version": 1, "images": pins} and text.endswith("}\n")
    assert _images.read_pins(text, "/p/image-pins.json") == pins
    assert _images.read_pins(None, "/p/image-pins.json") == {}


@pytest.mark.parametrize("text", ["{", '{"version": 2, "images": {}}', '{"version": 1, "images": {"r": {}}}',
                                  '{"version": 1, "images": {"r": {"image_id": "x", "source": "hosts"}}}'])
def test_a_pin_file_that_is_not_one_is_refused_by_name(text):
    with pytest.raises(InputError) as info:
        _images.read_pins(text, "/p/image-pins.json")
    assert str(info.value).startswith("/p/image-pins.json: ") and "remove it" in str(info.value)


def test_an_archives_images_from_its_manifest_and_its_sidecar():
    old = [{"Config": "a" * 64 + ".json", "RepoTags": ["b:1", "a:1"], "Layers": []}]
    oci = [{"Config": "blobs/sha256/" + "b" * 64, "RepoTags": None, "Layers": []}]
    assert _images.archive_images(json.dumps(old), "x.tar") == [{"image_id": ID_A, "repo_tags": ["a:1", "b:1"]}]
    assert _images.archive_images(json.dumps(oci), "x.tar") == [{"image_id": ID_B, "repo_tags": []}]
    for bad in ("", "[]", '[{"Config": "x"}]'):
        with pytest.raises(InputError, match="NARWHAL_IMAGE_ARCHIVE_DIR: x.tar: its manifest.json is not"):
            _images.archive_images(bad, "x.tar")
    assert _images.sidecar_sha256("%s  x.tar\n" % ("C" * 64), "x.tar") == "c" * 64
    assert _images.sidecar_sha256("%s *x.tar\n" % ("c" * 64), "x.tar") == "c" * 64
    with pytest.raises(InputError, match="x.tar.sha256 is not what sha256sum writes"):
        _images.sidecar_sha256("%s  y.tar\n" % ("c" * 64), "x.tar")


# ------------------------------------------------------------------------------------------------ the plan

def _read(present=None, digests=(), held=(), ref=REF, key="NARWHAL_IMAGE"):
    entry = {"key": key, "reference": ref, "present": present is not None, "image_id": present,
             "repo_digests": list(digests), "repo_tags": [ref] if present else []}
    return {"images": [entry], "held": sorted(set(held) | ({present} if present else set()))}


def _archive(name, image_id, tags=(REF,)):
    return {"path": "/a/" + name, "name": name, "sha256": "e" * 64, "size": 1,
            "images": [{"image_id": image_id, "repo_tags": list(tags)}]}


def _actions(plan):
    return dict((h, [(a["action"], a["image"], a["tag"]) for a in actions]) for h, actions in plan["hosts"].items())


def test_an_unpinned_reference_nobody_holds_is_resolved_by_one_host_then_pulled_by_digest():
    hosts = {"engine-1": _read(), "engine-2": _read(), "router-1": _read(key="NARWHAL_ROUTER_IMAGE")}
    first = _images.plan_images(hosts)
    assert first["pending"] == [REF] and first["resolvers"] == {REF: "engine-1"} and first["pins"] == {}
    assert _actions(first) == {"engine-1": [("pull-resolve", REF, False)], "engine-2": [("pull", None, True)],
                               "router-1": [("pull", None, True)]}
    assert first["registries"] == {"engine-1": [REG], "engine-2": [REG], "router-1": [REG]}
    pulled = [{"results": [{"reference": REF, "host": "engine-1", "image_id": ID_A, "digest": DIGEST_A}]},
              {"skipped": True, "results": []}]
    second = _images.plan_images(hosts, resolved=_images.resolved_pulls(pulled))
    assert second["pending"] == [] and second["pins"] == {REF: {"image_id": ID_A, "digest": DIGEST_A,
                                                                "source": "registry"}}
    assert _actions(second) == {"engine-1": [("none", None, False)], "engine-2": [("pull", DIGEST_A, True)],
                                "router-1": [("pull", DIGEST_A, True)]}
    assert json.loads(second["pin_text"])["images"][REF]["digest"] == DIGEST_A
    assert "engine-2: %s (NARWHAL_IMAGE): pull %s" % (REF, DIGEST_A) in second["lines"]


def test_the_pin_file_wins_and_a_host_gets_only_what_it_lacks():
    pins = {REF: {"image_id": ID_A, "digest": DIGEST_A, "source": "registry"}}
    hosts = {"engine-1": _read(ID_A, [DIGEST_A]), "engine-2": _read(None, held=[ID_A]), "engine-3": _read(),
             "engine-4": _read()}
    plan = _images.plan_images(hosts, pins, [_archive("other.tar", ID_B, ["x:1"])])
    assert _actions(plan) == {"engine-1": [("none", None, False)], "engine-2": [("tag", ID_A, True)],
                              "engine-3": [("pull", DIGEST_A, True)], "engine-4": [("pull", DIGEST_A, True)]}
    assert plan["lines"] == ["engine-2: %s (NARWHAL_IMAGE): tag %s as it" % (REF, ID_A),
                             "engine-3: %s (NARWHAL_IMAGE): pull %s" % (REF, DIGEST_A),
                             "engine-4: %s (NARWHAL_IMAGE): pull %s" % (REF, DIGEST_A)]
    assert plan["pin_text"] == _images.pin_text(pins)  # unchanged pins, the same bytes


def test_an_archive_comes_before_the_registry():
    pins = {REF: {"image_id": ID_A, "digest": DIGEST_A, "source": "registry"}}
    plan = _images.plan_images({"engine-1": _read()}, pins, [_archive("vllm.tar", ID_A, [])])
    (entry,) = plan["hosts"]["engine-1"]
    assert (entry["action"], entry["tag"], entry["archive"]) == \
        ("load", True, {"path": "/a/vllm.tar", "name": "vllm.tar", "sha256": "e" * 64})
    assert plan["registries"] == {"engine-1": []}
    # it pulls nothing, yet its reference's registry is where NARWHAL_REGISTRY_CA_FILE belongs on it (kept true)
    assert plan["ca_registries"] == {"engine-1": [REG]}


def test_the_hosts_that_hold_it_pin_it_when_nothing_else_does():
    hosts = {"engine-1": _read(ID_A, [DIGEST_A]), "engine-2": _read(ID_A), "engine-3": _read()}
    plan = _images.plan_images(hosts)
    assert plan["pins"] == {REF: {"image_id": ID_A, "digest": DIGEST_A, "source": "hosts"}}
    assert _actions(plan)["engine-3"] == [("pull", DIGEST_A, True)]


def test_an_archive_that_tags_it_pins_it_when_no_host_holds_it():
    plan = _images.plan_images({"engine-1": _read(), "engine-2": _read()}, {}, [_archive("v.tar", ID_B)])
    assert plan["pins"] == {REF: {"image_id": ID_B, "digest": None, "source": "archive"}}
    assert [a["action"] for h in ("engine-1", "engine-2") for a in plan["hosts"][h]] == ["load", "load"]


def test_repin_follows_the_registry_and_moves_the_hosts_that_differ():
    pins = {REF: {"image_id": ID_A, "digest": DIGEST_A, "source": "registry"}}
    hosts = {"engine-1": _read(ID_A, [DIGEST_A]), "engine-2": _read(ID_A, [DIGEST_A])}
    first = _images.plan_images(hosts, pins, repin=True)
    assert first["pending"] == [REF] and _actions(first)["engine-1"] == [("pull-resolve", REF, False)]
    resolved = {REF: {"host": "engine-1", "image_id": ID_B, "digest": DIGEST_B}}
    second = _images.plan_images(hosts, pins, repin=True, resolved=resolved)
    assert second["pins"][REF] == {"image_id": ID_B, "digest": DIGEST_B, "source": "registry"}
    assert _actions(second) == {"engine-1": [("none", None, False)], "engine-2": [("pull", DIGEST_B, True)]}


def test_repin_takes_the_archive_that_tags_it():
    pins = {REF: {"image_id": ID_A, "digest": None, "source": "archive"}}
    plan = _images.plan_images({"engine-1": _read(ID_A)}, pins, [_archive("new.tar", ID_B)], repin=True)
    assert plan["pins"][REF]["image_id"] == ID_B and _actions(plan)["engine-1"][0][0] == "load"


def test_an_image_id_the_hosts_hold_needs_nothing():
    plan = _images.plan_images({"engine-1": _read(ID_A, ref=ID_A)})
    assert _actions(plan) == {"engine-1": [("none", None, False)]}
    assert plan["pins"] == {ID_A: {"image_id": ID_A, "digest": None, "source": "hosts"}}


def test_a_digest_reference_is_pulled_never_loaded_or_tagged():
    ref = DIGEST_A
    hosts = {"engine-1": _read(ID_A, [DIGEST_A], ref=ref), "engine-2": _read(None, held=[ID_A], ref=ref)}
    plan = _images.plan_images(hosts, {}, [_archive("v.tar", ID_A)])
    assert _actions(plan)["engine-2"] == [("pull", DIGEST_A, False)]


# ------------------------------------------------------------------------------------------------ refusals

def _refusal(*args, **kwargs):
    with pytest.raises(InputError) as info:
        _images.plan_images(*args, **kwargs)
    return str(info.value)


def test_refused_the_tag_moved():
    pins = {REF: {"image_id": ID_A, "digest": DIGEST_A, "source": "registry"}}
    text = _refusal({"engine-1": _read(ID_A), "engine-2": _read(ID_B, [DIGEST_B])}, pins,
                    pin_file="/p/config/image-pins.json")
    assert text == ("NARWHAL_IMAGE: on host engine-2, %s is image %s (%s), but /p/config/image-pins.json pins it to "
                    "%s (%s) (source: registry): the tag moved since it was pinned. To deliver what the reference is "
                    "now to every host (an upgrade), rerun with -e deliver_image_repin=true; to keep the pinned "
                    "image, put it back on engine-2 (docker pull %s && docker tag %s %s), then rerun"
                    % (REF, ID_B, DIGEST_B, ID_A, DIGEST_A, DIGEST_A, DIGEST_A, REF))


def test_refused_hosts_that_disagree_without_a_pin():
    text = _refusal({"engine-1": _read(ID_A), "engine-2": _read(ID_B), "engine-3": _read(ID_A)})
    assert ("the hosts that hold %s disagree on its image (%s on engine-1, engine-3; %s on engine-2) and the pin "
            "file pins none yet. Rerun with -e deliver_image_repin=true" % (REF, ID_A, ID_B)) in text


def test_refused_an_image_id_a_host_lacks():
    text = _refusal({"engine-1": _read(ID_A, ref=ID_A), "engine-2": _read(ref=ID_A, key="NARWHAL_NODE_2_IMAGE")})
    assert text.startswith("NARWHAL_NODE_2_IMAGE: %s is an image ID, which no registry or archive delivers, and host "
                           "engine-2 does not hold it; load that image there (docker load)" % ID_A)


def test_refused_a_host_nothing_can_deliver_to():
    text = _refusal({"engine-1": _read(ID_A), "engine-2": _read()})
    assert text.startswith("NARWHAL_IMAGE: host engine-2 lacks %s, pinned to %s (source: hosts), and nothing can "
                           "deliver it: no archive of NARWHAL_IMAGE_ARCHIVE_DIR holds that image" % (REF, ID_A))
    pins = {REF: {"image_id": ID_A, "digest": None, "source": "archive"}}
    assert "host engine-1 lacks" in _refusal({"engine-1": _read()}, pins, [_archive("other.tar", ID_B)])


def test_refused_archives_that_disagree():
    text = _refusal({"engine-1": _read()}, {}, [_archive("a.tar", ID_A), _archive("b.tar", ID_B)])
    assert text.startswith("NARWHAL_IMAGE_ARCHIVE_DIR: the archives a.tar, b.tar tag %s as different images (%s, %s)"
                           % (REF, ID_A, ID_B))


def test_refused_a_reference_that_is_none():
    assert "give an image reference" in _refusal({"engine-1": _read(ref="img@sha256:xyz")})
