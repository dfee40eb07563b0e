"""What pictures ask of a backend (the draws that cross the protocol: tests/draws)."""
from __future__ import annotations


# -- what pictures ask of a backend (outlines.common.labels.Shown) -----------------------------
def test_every_backend_is_shown_by_a_label_without_its_url() -> None:
    from outlines.backends.function import FunctionBackend
    from outlines.backends.openai import OpenAIChatBackend, OpenAICompletionBackend
    from outlines.backends.transformers import TransformersBackend
    from outlines.common.labels import Shown, label_of

    url = "http://127.0.0.1:9/v1"
    backends = {
        OpenAIChatBackend("gpt-x", base_url=url, api_key="k"): "openai: gpt-x",
        OpenAICompletionBackend("tiny", base_url=url, api_key="k"): "openai_completion: tiny",
        TransformersBackend("/tmp/models/tiny-gpt2"): "transformers: tiny-gpt2",
        FunctionBackend(str.upper, name="upper", version="1"): "function: upper",
    }
    for backend, label in backends.items():
        assert isinstance(backend, Shown) and label_of(backend) == label
        assert "127.0.0.1" not in backend.label and "/tmp" not in backend.label


def test_a_backend_redacts_its_own_secrets_however_they_look() -> None:
    from outlines.backends.fallback import FallbackBackend
    from outlines.backends.function import FunctionBackend
    from outlines.backends.openai import OpenAIChatBackend

    url = "http://127.0.0.1:9/v1"
    first = OpenAIChatBackend("a", base_url=url, api_key="hunter2-not-key-shaped", headers={"X-Org": "org-swordfish"})
    second = OpenAIChatBackend("b", base_url=url, api_key="correct-horse")
    text = "sent hunter2-not-key-shaped, org-swordfish and correct-horse"
    assert first.redact(text) == "sent ***, *** and correct-horse"
    chain = FallbackBackend([first, second])
    assert chain.redact(text) == "sent ***, *** and ***" and chain.label == "fallback: a"
    assert FunctionBackend(str.upper, name="upper", version="1").redact(text) == text  # it holds no secret
