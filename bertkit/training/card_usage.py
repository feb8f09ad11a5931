"""The model card's usage section: a few lines of transformers that load the model and run it,
with the pipeline of its family where transformers has one (SWAG's multiple choice never had
one, and transformers 5 removed question-answering: the Auto model class then)."""

from __future__ import annotations

# How a card names a model that is not on the Hub: its directory, wherever it is copied to.
LOCAL_PLACEHOLDER = "path/to/model"

_PIPELINE = '''from transformers import pipeline

{name} = pipeline("{task}", model="{model}"{extra})
{call}'''

_MULTIPLE_CHOICE = '''import torch
from transformers import AutoModelForMultipleChoice, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{model}")
model = AutoModelForMultipleChoice.from_pretrained("{model}")
context = "A man sits down at the piano."
endings = ["He starts to play a song.", "He eats the piano.", "He swims across the room.",
           "He paints the sky."]
# One [CLS] context [SEP] ending [SEP] sequence per choice, in a batch of one question.
inputs = tokenizer([context] * len(endings), endings, padding=True, return_tensors="pt")
with torch.no_grad():
    logits = model(**{{key: value.unsqueeze(0) for key, value in inputs.items()}}).logits
print(endings[logits.argmax(-1).item()])'''

_QUESTION_ANSWERING = '''import torch
from transformers import AutoModelForQuestionAnswering, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{model}")
model = AutoModelForQuestionAnswering.from_pretrained("{model}")
question, context = "Where did the cat sit?", "The cat sat on the mat."
inputs = tokenizer(question, context, return_tensors="pt")
with torch.no_grad():
    output = model(**inputs)
# The best span of the context: its best start, then the best end from there.
outside = torch.tensor([segment != 1 for segment in inputs.sequence_ids()])
start = output.start_logits[0].masked_fill(outside, -1e9).argmax().item()
end = start + output.end_logits[0, start:].masked_fill(outside[start:], -1e9).argmax().item()
print(tokenizer.decode(inputs["input_ids"][0, start:end + 1]))'''

_FEATURE_BASED = (
    "{imports}from bertkit.tasks.ner.feature_based_tagger import load_feature_based_tagger\n\n"
    "# A frozen BERT with bertkit's tagger on its layers' features: no transformers pipeline.\n"
    "model, labels = load_feature_based_tagger({directory})")


def _classification_call(pair: bool, regression: bool) -> str:
    text = ('{"text": "The cat sat on the mat.", "text_pair": "A cat was sitting on the mat."}'
            if pair else '"The film was a delight from start to end."')
    what = "a sentence pair" if pair else "a sentence"
    note = ("score: the predicted value (a regression head)" if regression
            else "label: one of the model's class names")
    return f"# {what}; {note}\nprint(classifier({text}))"


def usage_code(family: str, model: str, *, on_hub: bool = False, pair: bool = False,
               regression: bool = False, feature_based: bool = False) -> str | None:
    """Python that loads `model` (a Hub id, on_hub, or a path) and runs it; None for an
    unknown family."""
    if family == "glue":
        return _PIPELINE.format(name="classifier", task="text-classification", model=model,
                                extra="", call=_classification_call(pair, regression))
    if family == "squad":
        return _QUESTION_ANSWERING.format(model=model)
    if family == "ner":
        if feature_based:  # bertkit's loader reads a directory: a Hub model's local copy
            return _FEATURE_BASED.format(
                imports="from huggingface_hub import snapshot_download\n" if on_hub else "",
                directory=f'snapshot_download("{model}")' if on_hub else f'"{model}"')
        return _PIPELINE.format(name="tagger", task="token-classification", model=model,
                                extra=', aggregation_strategy="simple"',
                                call='print(tagger("Angela Merkel visited Paris in May."))')
    if family == "swag":
        return _MULTIPLE_CHOICE.format(model=model)
    if family == "pretraining":
        return _PIPELINE.format(name="fill", task="fill-mask", model=model, extra="",
                                call='print(fill("The capital of France is [MASK]."))')
    return None


def usage_section(family: str, hub_model_id: str | None, **kinds) -> str | None:
    """The card's `## Usage` section: the model by its Hub id when it is pushed, else by
    LOCAL_PLACEHOLDER."""
    model = hub_model_id or LOCAL_PLACEHOLDER
    code = usage_code(family, model, on_hub=bool(hub_model_id), **kinds)
    if code is None:
        return None
    where = ("" if hub_model_id else
             f"`{LOCAL_PLACEHOLDER}`: this directory (`<run dir>/model`), or its Hub id once "
             f"uploaded.\n\n")
    return f"## Usage\n\n{where}```python\n{code}\n```\n"
