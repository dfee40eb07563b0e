"""Map-reduce over documents: summarize each one, then summarize the summaries.

All map calls are siblings, so they go to the backend as one batch (split by
``max_batch``); the reduce call waits only for them. Offline by default with a
deterministic fake model that keeps each text's first sentence.

    python examples/map_reduce.py                       # offline fake
    python examples/map_reduce.py --model transformers  # the tiny local GPT-2
"""
import argparse

import outlines
from outlines import models

DOCUMENTS = [
    "Batching merges sibling model calls. It cuts requests by orders of magnitude.",
    "A content-hash cache replays draws. Re-running a program costs nothing.",
    "Independent branches run concurrently. Wall time approaches the critical path.",
    "Traces record what ran when. Timelines show batches per backend.",
]


@outlines.prompt
def summarize(document):
    """Summarize in one sentence: {{ document }}
    Summary:"""


@outlines.prompt
def combine(summaries):
    """Combine these points into one sentence:
    {% for s in summaries %}- {{ s }}
    {% endfor %}Combined:"""


@outlines.fn(signature="(n)->()")
def bullet_list(summaries):
    return [s.strip() for s in summaries]


def first_sentence(prompts):
    """The offline fake, batched: the first sentence after the last colon."""
    texts = [p.rsplit(":", 2)[-2].strip().lstrip("- ") for p in prompts]
    return [t.split("\n")[0].split(". ")[0].rstrip(".") + "." for t in texts]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="function", help="function | transformers[:PATH]")
    args = parser.parse_args()
    if args.model.startswith("transformers"):
        from outlines.testing import build_tiny_model

        path = args.model.partition(":")[2] or build_tiny_model()
        llm = models.transformers(path, max_tokens=24, temperature=0)
    else:
        llm = models.from_function(first_sentence, batched=True, name="first_sentence", max_batch=2)

    documents = outlines.string("documents")
    summary = llm(combine(bullet_list(llm(summarize(documents)))))
    print(outlines.explain(summary, givens={documents: DOCUMENTS}), end="\n\n")  # what would be sent
    with outlines.trace() as trace:
        result = summary.eval({documents: DOCUMENTS})
    print(f"result: {result}\n")
    print(trace.summary())


if __name__ == "__main__":
    main()
