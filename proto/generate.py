"""Generate the Python code for proto/ into helix_transport/_proto/ (the one command).

Usage: python proto/generate.py [--check]

protoc writes imports as ``from helix.agent.v1 import ...``; they are rewritten to
live under ``helix_transport._proto`` so the generated code needs no sys.path tricks.
The ``.proto`` sources are copied beside their generated code, so the wheel carries the
contract (``helix-mesh proto --out DIR`` writes it out for another language's build).
``--check`` regenerates into a temporary directory and fails if the committed
files differ (CI runs it to keep generated code fresh).
"""

from __future__ import annotations

import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "helix_transport" / "_proto"
PACKAGE = "helix_transport._proto"


def generate(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent
    args = [
        "protoc",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for path in out.rglob("*.py*"):
        text = path.read_text()
        fixed = re.sub(r"^(from|import) helix\.", rf"\1 {PACKAGE}.helix.", text, flags=re.M)
        path.write_text(fixed)
    for proto in protos:
        (out / proto).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PROTO_DIR / proto, out / proto)
    for directory in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()


def main() -> int:
    if "--check" not in sys.argv:
        shutil.rmtree(OUT_DIR, ignore_errors=True)
        generate(OUT_DIR)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp)
        generate(fresh)
        stale = _differences(filecmp.dircmp(fresh, OUT_DIR))
        if stale:
            print("generated protobuf code is stale; run `make proto`:", *stale, sep="\n  ")
            return 1
    print("generated protobuf code is fresh")
    return 0


def _differences(cmp: filecmp.dircmp[str]) -> list[str]:
    found = [*cmp.left_only, *cmp.right_only, *cmp.diff_files]
    found = [f for f in found if f != "__pycache__"]
    for sub in cmp.subdirs.values():
        found += _differences(sub)
    return found


if __name__ == "__main__":
    raise SystemExit(main())
