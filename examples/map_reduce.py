"""Map-reduce over documents of different lengths: split, summarize every paragraph, combine.

Each document splits into its own number of paragraphs (a ragged value); the
map step sends every paragraph of every document to the model as ONE batch
(split by ``max_batch``), and the reduce step combines each document's own
summaries. Offline by default with a deterministic fake model that keeps each
text's first sentence.

    python examples/map_reduce.py                       # offline fake
    python examples/map_reduce.py --model transformers  # the tiny local GPT-2
"""
import argparse

import outlines
from outlines import models

DOCUMENTS = [
    "Batching merges sibling model calls. It cuts requests.\n\nOne call per level is the goal.",
    "A content-hash cache replays draws. Re-running costs nothing.",
    "Branches run concurrently. Wall time nears the critical path.\n\nSlow Python runs in threads."
    "\n\nAsync functions share the loop.",
]


@outlines.fn(signature="()->(n)", pure=True)  # pure: explain may run it to size the fan-out
def paragraphs(document):
    """A list per document: its paragraphs (a different number for each)."""
    return [p.strip() for p in document.split("\n\n") if p.strip()]


@outlines.prompt
def summarize(paragraph):
    """Summarize in one sentence: {{ paragraph }}
    Summary:"""


@outlines.prompt
def combine(summaries):
    """Combine these points into one sentence:
    {% for s in summaries %}- {{ s.strip() }}
    {% endfor %}Combined:"""


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
        llm = models.from_function(first_sentence, batched=True, name="first_sentence", max_batch=4)

    documents = outlines.string("documents")
    summaries = llm(summarize(paragraphs(documents)))  # ragged: (documents, paragraphs)
    digest = llm(combine(summaries))                    # one per document
    print(outlines.explain(digest, givens={documents: DOCUMENTS}), end="\n\n")  # what would be sent
    with outlines.trace() as trace:
        result = digest.eval({documents: DOCUMENTS})
    for document, line in zip(DOCUMENTS, result):
        print(f"{document[:30]!r}... -> {line}")
    print()
    print(trace.summary())


if __name__ == "__main__":
    main()
