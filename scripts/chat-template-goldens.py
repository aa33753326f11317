#!/usr/bin/env python3
"""Renders tests/data/chat/cases.json with Kimi K3's and Kimi Linear's own chat templates (the
Jinja files that llama.cpp ships in models/templates) in the environment Hugging Face's
apply_chat_template uses, into tests/data/chat/<format>.json: the goldens test_chat_template.cpp
checks hyla's renderings against. Needs python3-jinja2.

usage: scripts/chat-template-goldens.py LLAMA_CPP_DIR
"""
import copy
import json
import pathlib
import sys

import jinja2
import jinja2.filters
import jinja2.sandbox

TEMPLATES = {"kimi-k3": "Kimi-K3.jinja", "kimi-k2": "Kimi-K2-Instruct.jinja"}


def environment():
    # transformers' _compile_jinja_template: trim_blocks, lstrip_blocks, loop controls, and a tojson
    # that is json.dumps (no HTML escaping, non-ASCII kept). The sandbox is the mutable one, as in
    # llama.cpp's Jinja engine: Kimi K2's template appends to a list, which the immutable one refuses.
    env = jinja2.sandbox.SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def dictsort(value, case_sensitive=True, by="key", reverse=False):
        # K3's template sorts tool schemas with dictsort "to match the reference implementation",
        # whose json.dumps(sort_keys=True) sorts case-sensitively; Jinja's default does not.
        return jinja2.filters.do_dictsort(value, case_sensitive, by, reverse)

    env.filters["tojson"] = tojson
    env.filters["dictsort"] = dictsort
    env.globals["raise_exception"] = raise_exception
    return env


def object_arguments(messages):
    # OpenAI's call arguments are JSON text; K3's official encoder, and llama.cpp before a template
    # that takes objects (common/chat.cpp's func_args_not_string), parse them: one argument tag a key.
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls", []):
            text = call["function"].get("arguments")
            try:
                parsed = json.loads(text) if isinstance(text, str) else None
            except json.JSONDecodeError:  # llama.cpp refuses it; hyla renders the text as the template does
                parsed = None
            if isinstance(parsed, dict):
                call["function"]["arguments"] = parsed
    return out


def main():
    llama = pathlib.Path(sys.argv[1])
    root = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "chat"
    spec = json.loads((root / "cases.json").read_text())
    env = environment()
    for name, file in TEMPLATES.items():
        template = env.from_string((llama / "models" / "templates" / file).read_text())
        out = {}
        for case in spec["cases"]:
            kwargs = {k: case[k] for k in ("thinking", "thinking_effort", "tool_choice") if k in case}
            if case.get("with_tools"):
                kwargs["tools"] = spec["tools"]
            messages = object_arguments(case["messages"]) if name == "kimi-k3" else case["messages"]
            out[case["name"]] = template.render(messages=messages,
                                                add_generation_prompt=case["add_generation_prompt"], **kwargs)
        # Replies: the text a model writes after the generation prompt, as the template renders a
        # finished assistant message (what hyla must read back).
        replies = {}
        for case in spec["replies"]:
            ask = [{"role": "user", "content": "Go."}]
            prompt = template.render(messages=ask, add_generation_prompt=True, tools=spec["tools"])
            whole = template.render(messages=ask + [case["message"]], add_generation_prompt=False, tools=spec["tools"])
            assert whole.startswith(prompt), (name, case["name"])
            replies[case["name"]] = whole[len(prompt):]
        out = {"prompts": out, "replies": replies}
        (root / f"{name}.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
        print(f"{root / (name + '.json')}: {len(out['prompts'])} prompts and {len(replies)} replies rendered by {file}")


if __name__ == "__main__":
    main()
