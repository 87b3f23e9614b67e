# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site_inputs, the step (plugins/module_utils/_inputs/site.py, documented in plugins/modules/site_inputs.py): what
python-dotenv passes
silently, the output paths git must ignore, literal and secret values, hostile .env files, and the shipped
.env.example."""

import os
import shutil
import subprocess

import pytest
from test_support.inputs import TOKEN
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.paths import FALLBACK_IGNORED

# what python-dotenv passes silently, and the output paths (issue 13, classes 3 and 4)

ENV_TEXT = ("NARWHAL_FABRIC_INTERFACE=eth1\nNARWHAL_IMAGE=vllm/vllm-openai:v0.33.0\n"
            "NARWHAL_MODEL_PATH=/srv/models/tiny\nNARWHAL_NODE_1_ROLE=prefill\nNARWHAL_NODE_2_ROLE=decode\n")


def _without_narwhal_env(monkeypatch):
    """The controller environment without NARWHAL_* (site_inputs reads it by default)."""
    for key in [k for k in os.environ if k.startswith("NARWHAL_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def site_module(step_runner, tmp_path, monkeypatch):

    _without_narwhal_env(monkeypatch)

    def run(text, root=None, process_env=False):
        env_file = tmp_path / "site.env"
        env_file.write_text(text)
        args = {"env_file": str(env_file), "use_process_env": process_env}
        if root is not None:
            args["root"] = str(root)
        return step_runner("site_inputs", args)

    return run


# secrets and literal .env values (issue 13, class 5); hostile .env files (class 6)

SITE_ENV = ("NARWHAL_FABRIC_INTERFACE=eth1\nNARWHAL_IMAGE=vllm/vllm-openai:v0.33.0\n"
            "NARWHAL_MODEL_PATH=/srv/models/m\nNARWHAL_NODE_1_ROLE=prefill\nNARWHAL_NODE_2_ROLE=decode\n")


@pytest.fixture
def site(step_runner, monkeypatch, tmp_path):
    """site_inputs over a .env in tmp_path; the controller environment holds a token and no NARWHAL_*."""
    _without_narwhal_env(monkeypatch)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HOME", "/home/operator")

    def run(text, path=None):
        path = path or tmp_path / ".env"
        if text is not None:
            path.write_text(text)
        return step_runner("site_inputs", {"env_file": str(path)})

    return run


@pytest.mark.parametrize("text,key,words", [
    (ENV_TEXT + "NARWHAL_ENGINE_PORT=8000\nNARWHAL_ENGINE_PORT=9000\n", "NARWHAL_ENGINE_PORT",
     "is set twice in %s (lines 6 and 7); python-dotenv would keep the last value silently"),
    (ENV_TEXT + "NARWHAL_TRANSPRT=ucx_rdma\n", "NARWHAL_TRANSPRT", "did you mean NARWHAL_TRANSPORT?"),
    (ENV_TEXT + "NARWHAL_ENGINE_PORT 9000\n", "NARWHAL_ENV_FILE",
     "%s line 6 is not KEY=VALUE as python-dotenv reads it"),
    (ENV_TEXT + "NARWHAL_TP_SIZE\n", "NARWHAL_TP_SIZE", "line 6 names NARWHAL_TP_SIZE without '='"),
    (ENV_TEXT + 'NARWHAL_SERVED_MODEL_NAME="tiny\nNARWHAL_RUN_DIR=/tmp/evil"\n', "NARWHAL_SERVED_MODEL_NAME",
     "contains the control character '\\n'"),
])
def test_site_inputs_refuses_what_dotenv_passes_silently(site_module, tmp_path, text, key, words):
    status, result = site_module(text)
    assert status == "fail" and result["input"] == key, result
    assert (words % (tmp_path / "site.env") if "%s" in words else words) in result["msg"], result["msg"]


def test_site_inputs_ignores_tool_variables_and_warns_about_near_misses(site_module, monkeypatch):
    monkeypatch.setenv("NARWHAL_IMAGES", "sim real")  # the Makefile's, not an input
    monkeypatch.setenv("NARWHAL_TRANSPRT", "ucx_rdma")
    monkeypatch.setenv("NARWHAL_ENGINE_PORT", "9000")
    status, result = site_module(ENV_TEXT, process_env=True)
    assert status == "exit", result
    assert result["ansible_facts"]["narwhal_site"]["site"]["NARWHAL_ENGINE_PORT"] == 9000
    assert result["warnings"] == [
        "NARWHAL_TRANSPRT in the controller environment is not a site input (did you mean NARWHAL_TRANSPORT?) and "
        "is ignored"]


GIT = shutil.which("git")


def git_checkout(path):
    """A git repository with the project's .gitignore, as the checkout root."""
    path.mkdir()
    subprocess.run([GIT, "init", "-q", str(path)], check=True)
    shutil.copyfile(REPO / ".gitignore", path / ".gitignore")
    return path


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_site_inputs_asks_git_whether_the_outputs_are_ignored(site_module, tmp_path):
    root = git_checkout(tmp_path / "checkout")
    status, result = site_module(ENV_TEXT, root=root)
    assert status == "exit", result
    status, result = site_module(ENV_TEXT + "NARWHAL_CONFIG_DIR=docs\n", root=root)
    assert status == "fail" and result["input"] == "NARWHAL_CONFIG_DIR"
    assert "'docs': deployment.env would be docs/deployment.env inside the checkout, which git does not ignore" \
        in result["msg"]
    # git itself decides: once docs/ is ignored, the same input passes
    with open(root / ".gitignore", "a") as fh:
        fh.write("docs/\n")
    assert site_module(ENV_TEXT + "NARWHAL_CONFIG_DIR=docs\n", root=root)[0] == "exit"


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_site_inputs_refuses_tls_material_where_git_would_track_its_keys(site_module, tmp_path):
    """NARWHAL_TLS_DIR holds private keys (the site CA's, each host's): a git-tracked place is refused by name."""
    root = git_checkout(tmp_path / "checkout")
    status, result = site_module(ENV_TEXT + "NARWHAL_TLS_DIR=tls\n", root=root)
    assert status == "fail" and result["input"] == "NARWHAL_TLS_DIR", result
    assert "'tls': the site CA's private key (%s/ca.key) would be tls/ca.key inside the checkout, which git does " \
           "not ignore" % (root / "tls") in result["msg"], result["msg"]
    status, result = site_module(ENV_TEXT + "NARWHAL_TLS_DIR=%s\n" % (tmp_path / "outside"), root=root)
    assert status == "exit" and result["ansible_facts"]["narwhal_site"]["paths"]["tls_dir"] == str(tmp_path / "outside")


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_the_fallback_patterns_agree_with_the_shipped_gitignore(tmp_path):
    import fnmatch

    root = git_checkout(tmp_path / "checkout")
    samples = ["config/fleet.json", "config/fleet.site-a.json", "config/engine-launch.local.json",
               "config/deployment.env", "config/site-a/deployment.env", "config/engine-api.key", "runs/run-0",
               "docs/deployment.env", "config/other.json", "fleet.json", "README.md", "config/engine-launch.md"]
    for rel in samples:
        by_git = subprocess.run([GIT, "-C", str(root), "check-ignore", "-q", "--", rel], check=False).returncode == 0
        assert by_git == any(fnmatch.fnmatchcase(rel, p) for p in FALLBACK_IGNORED), rel


@pytest.mark.parametrize("value", ["${HOME}/models/m", "${HF_TOKEN}"])
def test_site_input_with_an_expansion_stays_literal_in_the_error(site, value):
    how, result = site(SITE_ENV.replace("/srv/models/m", value))
    assert how == "fail" and result["input"] == "NARWHAL_MODEL_PATH"
    assert "%r is not an absolute path" % value in result["msg"]
    assert "/home/operator" not in result["msg"] and TOKEN not in result["msg"]


def test_site_input_expansion_is_kept_and_warned(site):
    how, result = site(SITE_ENV + "NARWHAL_EXTRA_ARGS=--served-model-name-suffix ${USER}-model\n")
    assert how == "exit", result
    assert result["ansible_facts"]["narwhal_site"]["site"]["NARWHAL_EXTRA_ARGS"] == \
        "--served-model-name-suffix ${USER}-model"
    assert any("NARWHAL_EXTRA_ARGS holds '${...}', which stays literal" in w for w in result["warnings"])


@pytest.mark.parametrize("extra, key, shown", [
    # the controller's token pasted into an input: redacted as a known secret of the environment
    ("NARWHAL_FABRIC_INTERFACE=%s\n" % TOKEN, "NARWHAL_FABRIC_INTERFACE", "'<redacted>' is not a network interface"),
    # a secret of the .env itself (not a NARWHAL_ input), pasted into another input
    ("MY_SECRET=Zq9-site-secret\nNARWHAL_ENGINE_PORT=Zq9-site-secret\n", "NARWHAL_ENGINE_PORT",
     "'<redacted>' is not a whole number"),
    ("NARWHAL_EXTRA_ARGS=--api-key=sk-site-0123456789\n", "NARWHAL_EXTRA_ARGS", "'--api-key=<redacted>' overrides"),
    ("NARWHAL_ENGINE_ENV='HF_TOKEN=hf_x-9876543210'\n", "NARWHAL_ENGINE_ENV",
     "sets HF_TOKEN, which looks like a secret"),
    ("NARWHAL_NODE_1_URL=http://admin:pa55-w0rd@10.0.0.11:8000\n", "NARWHAL_NODE_1_URL",
     "user information"),
], ids=["env-token", "dotenv-secret", "api-key-flag", "engine-env", "url-password"])
def test_secret_values_are_redacted_in_site_errors(site, extra, key, shown):
    base = SITE_ENV.replace("NARWHAL_FABRIC_INTERFACE=eth1\n", "") if extra.startswith("NARWHAL_FABRIC_INTERFACE=") \
        else SITE_ENV
    how, result = site(base + extra)
    assert how == "fail" and result["input"] == key, result
    assert shown in result["msg"]
    for secret in (TOKEN, "Zq9-site-secret", "sk-site-0123456789", "hf_x-9876543210", "pa55-w0rd"):
        assert secret not in result["msg"]


@pytest.mark.parametrize("make, needle", [
    (os.mkfifo, "is a FIFO, not a regular file"),
    (lambda p: os.symlink(p.name, p), "is a symlink loop"),
    (lambda p: p.write_bytes(b"NARWHAL_FABRIC_INTERFACE=eth\xff1\n"), "is not UTF-8 text"),
], ids=["fifo", "symlink-loop", "latin-1"])
def test_hostile_env_file_is_named_not_waited_on(site, tmp_path, make, needle):
    path = tmp_path / "site.env"
    make(path)
    how, result = site(None, path)
    assert how == "fail" and needle in result["msg"] and str(path) in result["msg"]


def test_env_example_loads_unchanged_through_site_inputs(site_module, tmp_path):
    """The first documented step: the shipped .env.example, copied as it is into a project, is valid input and
    holds no Python None."""
    project = tmp_path / "project"
    project.mkdir()
    text = (REPO / ".env.example").read_text()
    assert "None" not in text
    status, result = site_module(text, root=project)
    assert status == "exit", result
    site = result["ansible_facts"]["narwhal_site"]
    assert site["project_dir"] == str(project)
    assert site["paths"]["fleet"] == str(project / "config" / "fleet.json")
    assert site["paths"]["runs_dir"] == str(project / "runs")
    assert site["paths"]["tls_dir"] == str(project / "config" / "tls")
    assert sorted(site["nodes"]) == ["1", "2"] and {n["ROLE"] for n in site["nodes"].values()} == {"prefill", "decode"}


# a sourced config/deployment.env in the operator's shell (issue 24): generated values are not overrides

GENERATED = {"NARWHAL_NODE_1_IP": "10.0.0.11", "NARWHAL_NODE_1_URL": "http://10.0.0.11:8000",
             "NARWHAL_NODE_1_ENGINE_PORT": "8000", "NARWHAL_NODE_1_ROLE": "prefill"}


@pytest.mark.parametrize("process,dotenv,echoes", [
    (GENERATED, {}, sorted(GENERATED)),  # the whole file sourced: every value is generated
    (dict(GENERATED, NARWHAL_NODE_1_GPU_IDS="0,1"), {},
     sorted(GENERATED)),  # GPU_IDS is not generated: an override as before
    # a node named only in part: overridden on purpose, even where a value equals the generated one
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000", "NARWHAL_NODE_1_GPU_IDS": "0,1"}, {}, []),
    ({"NARWHAL_NODE_1_IP": "10.0.0.99", "NARWHAL_NODE_1_URL": "http://10.0.0.99:9000"}, {}, []),
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.99:8000"}, {"NARWHAL_NODE_1_URL": "http://10.0.0.99:8000"}, []),
    ({"NARWHAL_NODE_1_URL": ""}, {}, []),  # blank: unset
])
def test_generated_echoes_are_recognised(process, dotenv, echoes):
    from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.site import generated_echoes

    assert generated_echoes(process, dotenv, GENERATED, "config/deployment.env") == echoes


@pytest.mark.parametrize("key,value", [("NARWHAL_NODE_1_ENGINE_PORT", "7000"),
                                       ("NARWHAL_NODE_1_URL", "http://10.0.0.11:7000")])
def test_a_generated_name_with_another_value_in_the_shell_is_refused_by_origin(key, value):
    from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
    from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.site import generated_echoes

    with pytest.raises(InputError) as err:
        generated_echoes(dict(GENERATED, **{key: value}), {}, GENERATED, "/p/config/deployment.env")
    assert err.value.key == key
    assert str(err.value).startswith("%s: %s=%s comes from the controller's environment (exported, or a sourced "
                                     "file), not from .env, and /p/config/deployment.env, which the last discovery "
                                     "generated, holds %s=%s" % (key, key, value, key, GENERATED[key]))


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_a_sourced_deployment_env_does_not_pin_the_engine_port(site_module, tmp_path, monkeypatch):
    """The shell sourced deployment.env (port 8000), then .env changed NARWHAL_ENGINE_PORT: the new port applies
    to every node; once discovery has written the new deployment.env, the stale shell value is refused by origin."""
    root = git_checkout(tmp_path / "checkout")
    (root / "config").mkdir()
    deployment = root / "config" / "deployment.env"
    deployment.write_text("".join("%s=%s\n" % kv for kv in GENERATED.items()))
    for key, value in GENERATED.items():
        monkeypatch.setenv(key, value)
    status, result = site_module(ENV_TEXT + "NARWHAL_ENGINE_PORT=9000\n", root=root, process_env=True)
    assert status == "exit", result
    site = result["ansible_facts"]["narwhal_site"]
    assert site["site"]["NARWHAL_ENGINE_PORT"] == 9000
    assert "ENGINE_PORT" not in site["nodes"]["1"] and "URL" not in site["nodes"]["1"]
    assert any("read as generated values, not as overrides" in w for w in result["warnings"])
    # discovery rewrote deployment.env for port 9000; the shell still holds 8000
    deployment.write_text(deployment.read_text().replace("8000", "9000"))
    status, result = site_module(ENV_TEXT + "NARWHAL_ENGINE_PORT=9000\n", root=root, process_env=True)
    assert status == "fail" and result["input"] == "NARWHAL_NODE_1_ENGINE_PORT"
    assert "NARWHAL_NODE_1_ENGINE_PORT=8000 comes from the controller's environment" in result["msg"]
