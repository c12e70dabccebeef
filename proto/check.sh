#!/usr/bin/env bash
# Guard the contract: `buf lint` (proto/buf.yaml) and `buf breaking` against the
# previous version of the proto in git. Run from anywhere: `bash proto/check.sh`.
#
# buf comes from the npm registry (@bufbuild/buf ships its binary): `make node-deps`
# runs `npm ci` in proto/. The baseline for `buf breaking`:
#   - on a branch other than main: the tip of main;
#   - on main (or a detached HEAD) with uncommitted changes under proto/: HEAD;
#   - on main with a clean proto/ (CI, a fresh clone of main): HEAD~1, the previous commit.
# Breaking is skipped, with a message, only when that baseline has no .proto file
# (e.g. the commit that introduces the contract) or there is no git history at all.
set -euo pipefail

cd "$(dirname "$0")"

BUF=./node_modules/.bin/buf
if [ ! -x "$BUF" ]; then
  if command -v buf >/dev/null 2>&1; then
    BUF=buf
  else
    echo "proto/check.sh: buf is not installed; run \`make node-deps\` (npm ci in proto/)" >&2
    exit 1
  fi
fi

echo "proto/check.sh: $("$BUF" --version | head -n1) lint"
"$BUF" lint

if ! top=$(git rev-parse --show-toplevel 2>/dev/null); then
  echo "proto/check.sh: not a git checkout; skipping buf breaking"
  exit 0
fi
subdir=$(git rev-parse --show-prefix)  # proto/ relative to the top, with a trailing slash
subdir=${subdir%/}
git_dir=$(git rev-parse --path-format=absolute --git-common-dir)

branch=$(git symbolic-ref --quiet --short HEAD 2>/dev/null || true)
if [ -n "$branch" ] && [ "$branch" != main ] && git rev-parse --verify --quiet refs/heads/main >/dev/null; then
  against_ref=main
  why="the tip of main (on branch $branch)"
elif ! git diff --quiet HEAD -- . 2>/dev/null || [ -n "$(git ls-files --others --exclude-standard -- '*.proto')" ]; then
  against_ref=HEAD
  why="HEAD (uncommitted changes under $subdir/)"
else
  if ! git rev-parse --verify --quiet 'HEAD~1^{commit}' >/dev/null \
    && [ "$(git rev-parse --is-shallow-repository)" = true ]; then
    git fetch --quiet --deepen=1 2>/dev/null || true  # a shallow clone: get one more commit
  fi
  against_ref=HEAD~1
  why="the previous commit (HEAD~1)"
fi

if ! against_sha=$(git rev-parse --verify --quiet "${against_ref}^{commit}"); then
  echo "proto/check.sh: no commit $against_ref to compare with; skipping buf breaking"
  exit 0
fi
if ! git ls-tree -r --name-only "$against_sha" -- . | grep -q '\.proto$'; then
  echo "proto/check.sh: $against_ref ($against_sha) has no .proto under $subdir/; skipping buf breaking"
  exit 0
fi

echo "proto/check.sh: buf breaking against $why, ${against_sha:0:12}"
"$BUF" breaking --against "${git_dir}#ref=${against_sha},subdir=${subdir}"
echo "proto/check.sh: ok"
