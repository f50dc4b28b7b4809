"""The rollout-ray command line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request


def test_serve_model_answers_until_interrupted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout_ray.cli", "serve-model", "--port", "0", "--ttft", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("simulated model serving at http://127.0.0.1:")
        url = line.rsplit(" ", 1)[1].strip()
        body = json.dumps({"messages": [{"role": "user", "content": "What is 17 + 25?"}]}).encode()
        request = urllib.request.Request(f"{url}/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            answer = json.load(resp)
        assert answer["choices"][0]["message"]["content"] == "42"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


def test_serve_model_rejects_invalid_settings_with_the_field_named() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rollout_ray.cli", "serve-model", "--error-rate", "2"],
        capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert "invalid settings" in result.stderr and "error_rate" in result.stderr
