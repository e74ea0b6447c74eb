"""Build the API reference (HTML) from the docstrings of the public surface, with pdoc.

    .venv/bin/pip install -e '.[docs]'
    .venv/bin/python scripts/api_reference.py [--output build/api]

The pages: `worker` (the SDK: `workflow`, `Queue`, the contexts, `Client`/`AsyncClient`, the
errors users catch), `worker.testing` (running workflows in a test), and the ledger API of
`supervisor` (`open_backend`, the clients every backend implements in `supervisor.ledger.contract`,
the values they return, the errors). Only what those modules export is shown: the child's runtime
(`worker._runtime`), the sample apps and the supervisor's internals are not public. The command
line's reference is docs/cli.md (scripts/cli_reference.py).

Every warning pdoc gives (a module that does not import, a docstring or an annotation it cannot
read) is an error here, so `.ci/run` fails on it. Docstrings are Markdown, as the code writes them:
a name in backticks that pdoc can resolve becomes a link.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = (
    "worker",
    "worker.testing",
    "supervisor",
    "supervisor.ledger.backends",
    "supervisor.ledger.contract",
    "supervisor.ledger.values",
    "supervisor.ledger.errors",
)
# pdoc reads a method's annotations in its class's namespace, where the clients' own `list`
# methods hide the builtin: `-> list[str]` then cannot be evaluated and is shown as written.
# Python reads them in the module's namespace (`typing.get_type_hints`), where they are sound.
SHADOWED_LIST = (r"Error parsing type annotation .*\blist\[.* for supervisor\.ledger\.contract\.\w+Client\.\w+: "
                 r"'function' object is not subscriptable")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(ROOT / "build" / "api"), help="folder to write (default: build/api)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import pdoc
    import pdoc.render

    warnings.simplefilter("error")
    warnings.filterwarnings("ignore", message=SHADOWED_LIST, category=UserWarning)
    pdoc.render.configure(docformat="markdown", show_source=False, search=True)
    output = Path(args.output)
    try:
        pdoc.pdoc(*MODULES, output_directory=output)
    except Warning as warning:
        print(f"api_reference: {warning}", file=sys.stderr)
        return 1
    pages = sorted(p.relative_to(output).as_posix() for p in output.rglob("*.html"))
    print(f"wrote {len(pages)} pages to {output}: {', '.join(pages)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
