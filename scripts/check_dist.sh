#!/usr/bin/env bash
# Build rstar-env's wheel and sdist as a release would, install them into a fresh virtual environment as a user
# would (not editable, dependencies from the package index, nothing from the checkout on the path), and check
# that the installed product works:
#   * the wheel built from the sdist holds the same files as the wheel built from the tree, and every module of
#     the source folders (rstar_env/, plugins/, trainers/) is in it, with the py.typed markers;
#   * every installed module imports; one that fails only for want of an optional extra (torch, ray, ...) is
#     reported as skipped, with the extra's name; any other failure fails the check;
#   * `rstar-env episode` plays a scripted episode (a python tool call, then \boxed{5}) to reward 1;
#   * `rstar-env plugins` lists the built-in tool, reward and sampler; after the examples and testkit wheels are
#     installed too, it also lists the example plugins, and `import rstar_env_testkit` works.
#
#   bash scripts/check_dist.sh           the working tree's files (tracked, and untracked ones git does not ignore)
#   bash scripts/check_dist.sh --clone   only what is committed: a clone of HEAD (CI)
#
# PYTHON: the interpreter that builds and makes the venv (default .venv/bin/python, else python3); it needs the
# `build` package (in the dev extra), or else one is installed into a throwaway venv. KEEP=1 keeps the work folder.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
start=$SECONDS

mode=tree
case "${1:-}" in
    "") ;;
    --clone) mode=clone ;;
    --tree) mode=tree ;;
    *) echo "usage: bash scripts/check_dist.sh [--tree|--clone]" >&2; exit 2 ;;
esac
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x .venv/bin/python ]]; then PY=$repo/.venv/bin/python
else PY=python3
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rstar-check-dist-XXXXXX")
cleanup() { if [[ -n "${KEEP:-}" ]]; then echo "check_dist: kept $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
step() { echo "check_dist: [$((SECONDS - start))s] $*"; }
fail() { echo "check_dist: FAIL: $*" >&2; exit 1; }
pip_quiet() { grep -v -e "^WARNING: Location 'file:" -e "^$" || true; }  # this machine's local mirrors: noise

# -- the sources ------------------------------------------------------------------------------------------------
src=$work/src
if [[ $mode == clone ]]; then
    step "sources: a clone of HEAD ($(git rev-parse --short HEAD)), committed files only"
    git clone -q --no-local "$repo" "$src"
else
    step "sources: the working tree (tracked files and untracked ones git does not ignore; --clone: HEAD only)"
    mkdir "$src"
    # A file deleted but not yet committed is listed and absent: skipped (--ignore-failed-read).
    git ls-files -z -co --exclude-standard \
        | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$src"
fi

cd "$work"  # not the checkout: nothing in it (a build/ folder, the sources) may shadow what is installed

# -- the builder -------------------------------------------------------------------------------------------------
if ! "$PY" -m build --version >/dev/null 2>&1; then
    step "$PY has no 'build' package (the dev extra has it): installing it into a throwaway venv"
    "$PY" -m venv "$work/tools"
    "$work/tools/bin/python" -m pip install -q build 2>&1 | pip_quiet
    PY=$work/tools/bin/python
fi

dist=$work/dist
build_quiet() {  # python -m build, its output shown only when it fails
    local log=$work/build.log
    "$PY" -m build "$@" >"$log" 2>&1 || { cat "$log" >&2; fail "python -m build $* failed (output above)"; }
}
step "building rstar-env: the sdist, and a wheel from the sdist"
build_quiet --outdir "$dist/from-sdist" "$src"
step "building rstar-env: a wheel from the tree (as 'pip wheel .' does)"
build_quiet --wheel --outdir "$dist/from-tree" "$src"
step "building the rstar-env-examples and rstar-env-testkit wheels"
build_quiet --wheel --outdir "$dist/extras" "$src/examples"
build_quiet --wheel --outdir "$dist/extras" "$src/testkit"
sdist=$(ls "$dist"/from-sdist/*.tar.gz)
wheel=$(ls "$dist"/from-sdist/*.whl)

# -- what the wheels hold ----------------------------------------------------------------------------------------
step "checking the wheels' contents against the source folders"
"$PY" - "$src" "$wheel" "$(ls "$dist"/from-tree/*.whl)" "$sdist" <<'EOF' || fail "the distribution leaves files out (above)"
import sys, tarfile, zipfile
from pathlib import Path

src, from_sdist, from_tree, sdist = Path(sys.argv[1]), *sys.argv[2:]
layout = {"rstar_env": "rstar_env", "rstar_plugins": "plugins", "rstar_trainers": "trainers"}  # the design's
expected = {f"{name}/py.typed" for name in layout}
for name, folder in layout.items():
    for path in (src / folder).rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            expected.add(f"{name}/{path.relative_to(src / folder).as_posix()}")

def package_files(wheel):
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if n.split("/")[0] in layout}

got, direct = package_files(from_sdist), package_files(from_tree)
ok = True
for what, files in (("the wheel built from the sdist", got), ("the wheel built from the tree", direct)):
    if missing := sorted(expected - files):
        ok = False
        print(f"check_dist: {what} lacks {len(missing)} file(s): {missing[:20]}")
    if extra := sorted(files - expected):
        ok = False
        print(f"check_dist: {what} has files that are not in the source folders: {extra[:20]}")
with tarfile.open(sdist) as tf:
    top = tf.getnames()[0].split("/")[0]
    in_sdist = {n.removeprefix(top + "/") for n in tf.getnames()}
for required in ("setup.py", "pyproject.toml", "README.md"):
    if required not in in_sdist:
        ok = False
        print(f"check_dist: the sdist lacks {required}")
packages = sum(1 for f in got if f.endswith("/__init__.py"))
if ok:
    print(f"check_dist: {len(got)} files in {packages} packages, the same in both wheels")
sys.exit(0 if ok else 1)
EOF

# -- a fresh environment, as a user's ----------------------------------------------------------------------------
venv=$work/venv
step "a fresh virtual environment (no system site-packages) at $venv"
if command -v uv >/dev/null 2>&1; then
    uv venv --quiet --seed --python "$PY" "$venv"
else
    "$PY" -m venv "$venv"
fi
vpy=$venv/bin/python
step "installing $(basename "$wheel") and its dependencies from the package index"
"$vpy" -m pip install -q --disable-pip-version-check "$wheel" 2>&1 | pip_quiet

step "importing every installed module"
"$vpy" - <<'EOF' || fail "modules fail to import (above)"
import importlib, importlib.metadata as md, pkgutil, re, sys, traceback

# Which extra brings each optional dependency, from the installed metadata: `torch>=2.1; extra == "local"`.
extra_of: dict[str, str] = {}
for requirement in md.requires("rstar-env") or ():
    found = re.match(r'\s*([A-Za-z0-9._-]+).*extra\s*==\s*"([^"]+)"', requirement)
    if found:
        extra_of.setdefault(re.sub(r"[-.]+", "_", found[1]).lower(), found[2])
# Modules these extras bring under another name, or through their own dependencies.
extra_of.update({"e2b": extra_of.get("e2b_code_interpreter", "e2b"), "deepspeed": "openrlhf", "vllm": "openrlhf",
                 "openenv": extra_of.get("openenv_core", "serve")})

def missing_extra(exc: BaseException) -> str | None:
    """The extra whose absence explains the failure, if that is all it is."""
    while exc is not None:
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            return extra_of.get(exc.name.split(".")[0])
        exc = exc.__cause__ or exc.__context__
    return None

names: list[str] = []
for top in ("rstar_env", "rstar_plugins", "rstar_trainers"):
    package = importlib.import_module(top)
    names.append(top)
    names += [m.name for m in pkgutil.walk_packages(package.__path__, top + ".", onerror=lambda name: None)]
failed, skipped, ok = [], {}, 0
for name in sorted(set(names)):
    if name.rsplit(".", 1)[-1] == "__main__":
        continue  # importing it runs the command
    try:
        importlib.import_module(name)
        ok += 1
    except Exception as exc:  # noqa: BLE001 - every failure is reported
        extra = missing_extra(exc)
        if extra is not None:
            skipped[name] = f"needs the '{extra}' extra ({type(exc).__name__}: {exc})"
        else:
            failed.append(name)
            print(f"check_dist: import {name} failed:\n{traceback.format_exc()}")
for name, why in skipped.items():
    print(f"check_dist:   skipped {name}: {why}")
print(f"check_dist: {ok} modules import, {len(skipped)} skipped for a missing extra, {len(failed)} failed")
sys.exit(1 if failed else 0)
EOF

step "rstar-env episode: a python tool call, then \\boxed{5}"
cat >"$work/script.json" <<'EOF'
["<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(2+3)\"}}\n</tool_call>",
 "2 + 3 = 5, so the answer is \\boxed{5}."]
EOF
"$venv/bin/rstar-env" episode --problem "What is 2+3?" --answer 5 --script "$work/script.json" >"$work/episode.out" 2>&1 \
    || { cat "$work/episode.out" >&2; fail "rstar-env episode exited with an error (output above)"; }
grep -q "^5$" "$work/episode.out" || { cat "$work/episode.out" >&2; fail "the python tool's output (5) is not shown"; }
grep -Eq "end: answer +reward: 1(\.0)? " "$work/episode.out" \
    || { cat "$work/episode.out" >&2; fail "the episode did not end with the answer and reward 1 (output above)"; }
echo "check_dist: $(grep -E '^end: ' "$work/episode.out")"

expect_plugins() {  # expect_plugins KIND/NAME...: each listed by `rstar-env plugins` (tab-separated when piped)
    "$venv/bin/rstar-env" plugins >"$work/plugins.out" 2>&1 \
        || { cat "$work/plugins.out" >&2; fail "rstar-env plugins exited with an error (output above)"; }
    local want
    for want in "$@"; do
        awk -F'\t' -v k="${want%/*}" -v n="${want#*/}" '$1 == k && $2 == n { found = 1 } END { exit !found }' \
            "$work/plugins.out" || { cat "$work/plugins.out" >&2; fail "rstar-env plugins does not list $want"; }
    done
}
step "rstar-env plugins: the built-ins"
expect_plugins tool/python reward/math sampler/roc

step "installing the rstar-env-examples and rstar-env-testkit wheels into the same venv"
"$vpy" -m pip install -q --disable-pip-version-check "$dist"/extras/*.whl 2>&1 | pip_quiet
expect_plugins tool/python reward/math sampler/roc tool/calculator reward/exact_match sampler/keep_shortest
"$vpy" -c 'import rstar_env_testkit, rstar_examples.plugins' || fail "the testkit or examples package does not import"
"$vpy" -c 'from importlib.resources import files; import sys; sys.exit(not files("rstar_env_testkit").joinpath("_e2b_kernel.py").is_file())' \
    || fail "the testkit wheel lacks _e2b_kernel.py (its e2b server reads it)"

step "PASS: the wheel and the sdist install and work ($((SECONDS - start))s)"
