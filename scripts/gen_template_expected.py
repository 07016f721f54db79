#!/usr/bin/env python3
"""Render every chat template in tests/data/templates/*.jinja for every case of
tests/data/templates/cases.json exactly as Hugging Face transformers'
`apply_chat_template` does (chat_template_utils.py `_compile_jinja_template` and
`render_jinja_template`), and write the results under tests/data/templates/expected/.

Only jinja2 (>= 3.1) is needed:   pip install jinja2
Run from the repository root:     python3 scripts/gen_template_expected.py

Output per template (file stem) and case:
  expected/<template>/<case>.txt    the rendering, byte for byte
  expected/<template>/<case>.error  the TemplateError message when the template rejects the case

`strftime_now` is pinned to cases.json's "now" so the renderings are reproducible; the Rust
test passes the same instant through `ChatTemplate::with_now`.
"""

import json
import pathlib
import shutil
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "tests" / "data" / "templates"


class AssistantTracker(jinja2.ext.Extension):
    """transformers' `{% generation %}` tag: renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def compile_template(source: str, now: datetime):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def main() -> int:
    if tuple(int(p) for p in jinja2.__version__.split(".")[:2]) < (3, 1):
        print(f"jinja2 >= 3.1 needed, found {jinja2.__version__}", file=sys.stderr)
        return 1
    spec = json.loads((TEMPLATES / "cases.json").read_text(encoding="utf-8"))
    now = datetime.fromisoformat(spec["now"])
    out_root = TEMPLATES / "expected"
    if out_root.exists():
        shutil.rmtree(out_root)
    n_ok = n_err = 0
    for path in sorted(TEMPLATES.glob("*.jinja")):
        name = path.stem
        template = compile_template(path.read_text(encoding="utf-8"), now)
        special = spec["special_tokens"].get(name, {})
        out_dir = out_root / name
        out_dir.mkdir(parents=True)
        for case in spec["cases"]:
            # As apply_chat_template: special tokens first, then the caller's kwargs.
            kwargs = {k: v for k, v in special.items() if v is not None}
            kwargs.update(case.get("extra", {}))
            try:
                text = template.render(
                    messages=case["messages"],
                    tools=case.get("tools"),
                    documents=None,
                    add_generation_prompt=case["add_generation_prompt"],
                    **kwargs,
                )
            except Exception as e:  # TemplateError (raise_exception, undefined) or a TypeError
                (out_dir / f"{case['name']}.error").write_text(f"{type(e).__name__}: {e}\n", encoding="utf-8")
                n_err += 1
                continue
            (out_dir / f"{case['name']}.txt").write_bytes(text.encode("utf-8"))
            n_ok += 1
    print(f"wrote {n_ok} renderings and {n_err} rejections under {out_root.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
