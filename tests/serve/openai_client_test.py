"""dsc-serve with the official `openai` Python client (exit 77 = skipped when
the package is absent): models.list, completions (JSON and streamed, same
text), chat completions through --chat-template phi-3, and the client's
exception types for 400 and 401. Starts the server itself on 127.0.0.1 and
always stops it (SIGTERM, exit 0 checked; SIGKILL if it hangs).

Usage: openai_client_test.py DSC_SERVE MODEL_DIR
"""
import subprocess
import sys

try:
    import openai
except ImportError:
    print("the openai package is not installed: skipped")
    sys.exit(77)


def main():
    app, model = sys.argv[1], sys.argv[2]
    proc = subprocess.Popen([app, model, "--port", "0", "--api-key", "k", "--served-model-name", "m",
                             "--chat-template", "phi-3"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", timeout=30, max_retries=0)
        assert [m.id for m in client.models.list()] == ["m"]
        r = client.completions.create(model="m", prompt="ROMEO:", max_tokens=12, temperature=0, seed=3)
        text = r.choices[0].text
        assert r.usage.prompt_tokens == 6 and r.usage.completion_tokens == 12, r.usage
        assert r.choices[0].finish_reason == "length"
        chunks = list(client.completions.create(model="m", prompt="ROMEO:", max_tokens=12, temperature=0,
                                                stream=True))
        assert "".join(c.choices[0].text for c in chunks) == text
        assert len(chunks) == 12
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=6, temperature=0)
        assert chat.choices[0].message.role == "assistant"
        assert chat.usage.prompt_tokens == len("<|user|>\nHi<|end|>\n<|assistant|>\n")
        try:
            client.completions.create(model="m", prompt="x", max_tokens=2, extra_body={"best_of": 2})
            raise AssertionError("best_of accepted")
        except openai.BadRequestError as e:
            assert e.body["param"] == "best_of", e.body
        try:
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0).models.list()
            raise AssertionError("wrong key accepted")
        except openai.AuthenticationError:
            pass
        print(f"openai {openai.__version__}: completion {text!r}, stream equal, chat {chat.choices[0].message.content!r}")
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    assert code == 0, f"dsc-serve exited {code}"


if __name__ == "__main__":
    main()
