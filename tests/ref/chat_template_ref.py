"""Renders the chat templates of four model families with jinja2 (as
transformers' apply_chat_template does: trim_blocks, lstrip_blocks,
add_generation_prompt) for a few conversations, into
tests/serve/fixtures/chat_templates.json, which test_serve_units compares
with dsc-serve's built-in templates byte for byte.

The template strings are the `chat_template` of each family's
tokenizer_config.json: Meta-Llama-3-8B-Instruct, Mistral-7B-Instruct-v0.2,
Qwen2-7B-Instruct, Phi-3-mini-4k-instruct.

Rerun: /opt/venv/bin/python tests/ref/chat_template_ref.py
"""
import json
import os

import jinja2

TEMPLATES = {
    "llama-3": (
        "{% set loop_messages = messages %}{% for message in loop_messages %}"
        "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
        "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    ),
    "mistral": (
        "{{ bos_token }}{% for message in messages %}"
        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
        "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
        "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
        {"bos_token": "<s>", "eos_token": "</s>"},
    ),
    "chatml": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
        {"bos_token": "", "eos_token": "<|im_end|>"},
    ),
    "phi-3": (
        "{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
        "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
        "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
        {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    ),
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "  Name a colour.\n"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, in Fran\u00e7ais?"},
    ],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
    ],
]


def raise_exception(msg):
    raise ValueError(msg)


def main():
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    out = []
    for name, (source, tokens) in TEMPLATES.items():
        template = env.from_string(source)
        for messages in CONVERSATIONS:
            try:
                text = template.render(messages=messages, add_generation_prompt=True, **tokens)
            except ValueError:
                continue  # mistral refuses a system role: dsc's extension is tested on its own
            out.append({"template": name, "messages": messages, "text": text})
    path = os.path.join(os.path.dirname(__file__), "..", "serve", "fixtures", "chat_templates.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(out)} renderings to {path}")


if __name__ == "__main__":
    main()
