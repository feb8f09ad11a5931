"""The held-out MLM set: whole documents held out by a hash of their text, never trained on,
masked once, identical in every arm of a comparison; its score agrees with an independent
computation for bertkit's model and transformers' classes alike; its curve through training
and across a resume."""

from __future__ import annotations

import functools
import json
import random

import numpy as np
import pytest
import torch
from torch.nn import functional
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertTokenizerFast,
    Trainer,
    TrainingArguments,
)

from bertkit.errors import BertkitError
from bertkit.pretraining.heldout import (
    HeldoutEvaluation,
    build_heldout,
    document_keys,
    heldout_collator,
    heldout_curve,
    heldout_fingerprint,
    score_heldout,
    split_documents,
)
from bertkit.pretraining.masking import IGNORE_INDEX
from bertkit.pretraining.model import MaskedOnlyBertForPreTraining
from bertkit.pretraining.objective import documents_dataset
from bertkit.pretraining.run import (
    check_pretraining_config,
    prepare_pretraining_data,
    pretrain,
    split_corpus,
)
from bertkit.training import run as training_run
from bertkit.training.run import build_training_arguments
from bertkit.training.stop_and_resume import ClockCallback, TrainingClock
from tests.conftest import compose_config
from tests.pretraining.test_pretrain_recipe import small_run

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."]
WORDS = [f"w{i}" for i in range(60)]
N_DOCUMENTS = 60
# Document i's own word; none is a prefix of another (a trained vocabulary would hold "mark1"
# as a step towards "mark12").
MARKERS = [f"mark{i:02d}" for i in range(N_DOCUMENTS)]


def generated_documents(n: int = N_DOCUMENTS, seed: int = 0) -> list[list[str]]:
    """Document i: 4-10 sentences of random words, each sentence carrying its marker (document
    i's own word for i < N_DOCUMENTS)."""
    rng = np.random.default_rng(seed)
    return [[" ".join([MARKERS[i % N_DOCUMENTS], *rng.choice(WORDS, size=rng.integers(6, 14))])
             + " ."
             for _ in range(rng.integers(4, 11))] for i in range(n)]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    directory = tmp_path_factory.mktemp("heldout-vocab")
    (directory / "vocab.txt").write_text("\n".join(SPECIALS + WORDS + MARKERS) + "\n")
    return directory


@pytest.fixture(scope="module")
def tokenizer(vocab):
    return BertTokenizerFast.from_pretrained(str(vocab))


def write_corpus(path, documents) -> None:
    """Google's format: a sentence a line, a blank line between documents."""
    path.write_text("\n\n".join("\n".join(document) for document in documents) + "\n")


def config(**extra):
    """The pretraining recipe on 128-token sequences, the held-out set at its defaults."""
    overrides = {"recipe": "pretrain", "model": "scratch_tiny",
                 "model.config.max_position_embeddings": 128, "logger": "none",
                 "pretraining.max_seq_length": 128, "pretraining.long_phase.fraction": 0.0,
                 "trainer.max_steps": 4, **extra}
    return compose_config([f"{key}={value}" for key, value in overrides.items()])


def texts(documents) -> set[str]:
    return {"\n".join(row["sentences"]) for row in documents}


# The split


def test_the_same_documents_are_held_out_whatever_the_order():
    documents = generated_documents()
    train, heldout = split_documents(documents_dataset(documents), 0.2)
    shuffled = documents[:]
    random.Random(3).shuffle(shuffled)
    train_shuffled, heldout_shuffled = split_documents(documents_dataset(shuffled), 0.2)
    assert texts(heldout) == texts(heldout_shuffled) and 0 < len(heldout) < N_DOCUMENTS
    assert texts(train) == texts(train_shuffled)
    assert not texts(train) & texts(heldout)
    assert len(train) + len(heldout) == N_DOCUMENTS
    # A larger fraction holds out more, and everything a smaller one held out.
    held = [texts(split_documents(documents_dataset(documents), fraction)[1])
            for fraction in (0.05, 0.2, 0.5)]
    assert held[0] <= held[1] <= held[2] and len(held[0]) < len(held[1]) < len(held[2])
    whole = documents_dataset(documents)
    assert split_documents(whole, 0.0) == (whole, None)


def test_a_small_corpus_still_gets_a_heldout_set_of_the_smallest_keys():
    documents = generated_documents(8)
    keys = document_keys(documents_dataset(documents))
    smallest = {"\n".join(documents[i]) for i in np.argsort(keys)[:2]}
    # A fraction that selects none: the two documents of smallest key, whatever the order.
    for order in (documents, documents[::-1]):
        train, heldout = split_documents(documents_dataset(order), 1e-9, min_documents=2)
        assert texts(heldout) == smallest and len(train) == 6
    # A fraction that selects enough is left alone: the minimum only fills a shortfall.
    fraction = float(np.sort(keys)[3]) + 1e-12
    assert len(split_documents(documents_dataset(documents), fraction, 2)[1]) == 4
    # Training keeps 2 documents (NSP's own minimum): 3 documents hold out 1, 2 hold out 1.
    for n in (3, 2):
        train, heldout = split_documents(documents_dataset(documents[:n]), 1e-9, 2)
        assert (len(train), len(heldout)) == (n - 1, 1)
    with pytest.raises(BertkitError, match="heldout.fraction=0"):
        split_documents(documents_dataset(documents[:1]), 0.05, 2)


def test_nsp_on_a_small_corpus_is_scored_on_two_heldout_documents(tmp_path, vocab):
    """CI's real-data run: 8 documents, the default fraction selected 1 held-out document,
    and NSP's held-out pairs could not draw a NotNext segment."""
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus, generated_documents(8))
    cfg = config(**{"corpus": "files", "corpus.files": f"[{corpus}]", "model.tokenizer": vocab,
                    "masking": "dynamic", "objective": "mlm_nsp",
                    "cache_dir": tmp_path / "cache"})
    prepared = prepare_pretraining_data(cfg,
                                        build_training_arguments(cfg,
                                                                 tmp_path, []))
    assert prepared.heldout.documents == 2 and prepared.train_documents == 6
    labels = prepared.heldout.pairs["next_sentence_label"]
    assert 0 < sum(labels) < len(labels)  # both IsNext and NotNext pairs
    with pytest.raises(BertkitError, match="NSP's held-out pairs need 2 held-out documents"):
        build_heldout(cfg.heldout, cfg.pretraining, cfg.objective, prepared.tokenizer,
                      documents_dataset(generated_documents(1)))


@pytest.mark.parametrize(("masking", "objective"),
                         [("static", "mlm_nsp"), ("dynamic", "mlm")])
def test_training_data_holds_no_heldout_text(tmp_path, vocab, masking, objective):
    documents = generated_documents()
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus, documents)
    extra = {"masking.dupe_factor": 1} if masking == "static" else {}
    cfg = config(**{"corpus": "files", "corpus.files": f"[{corpus}]", "model.tokenizer": vocab,
                    "masking": masking, "objective": objective, "heldout.fraction": 0.2,
                    "cache_dir": tmp_path / "cache", **extra})
    prepared = prepare_pretraining_data(cfg,
                                        build_training_arguments(cfg,
                                                                 tmp_path, []))
    marker_ids = dict(zip(MARKERS, prepared.tokenizer.convert_tokens_to_ids(MARKERS),
                          strict=True))
    held_markers = {marker_ids[marker] for marker in heldout_markers(cfg)}
    assert len(held_markers) == prepared.heldout.documents > 0
    assert prepared.train_documents == N_DOCUMENTS - len(held_markers)
    seen = set()  # the training text: the original token where masked, else the input
    for row in prepared.train_dataset:
        labels = row.get("labels") or [IGNORE_INDEX] * len(row["input_ids"])
        seen.update(label if label != IGNORE_INDEX else token
                    for token, label in zip(row["input_ids"], labels, strict=True))
    assert not seen & held_markers  # held-out text never reaches training
    assert set(marker_ids.values()) - held_markers <= seen
    heldout_ids = {label if label != IGNORE_INDEX else token for row in prepared.heldout.mlm
                   for token, label in zip(row["input_ids"], row["labels"], strict=True)}
    assert heldout_ids & held_markers and not heldout_ids & (set(marker_ids.values())
                                                             - held_markers)


def heldout_markers(cfg) -> set[str]:
    """The markers of the documents the run's own split holds out."""
    return {row["sentences"][0].split()[0] for row in split_corpus(cfg)[1]}


def test_the_vocabulary_is_trained_without_the_heldout_documents(tmp_path):
    documents = generated_documents()
    corpus = tmp_path / "corpus.txt"
    write_corpus(corpus, documents)
    cfg = config(**{"corpus": "files", "corpus.files": f"[{corpus}]", "masking": "dynamic",
                    "objective": "mlm", "heldout.fraction": 0.2, "cache_dir": tmp_path / "cache",
                    "tokenizer_training.enabled": True, "tokenizer_training.vocab_size": 400})
    prepared = prepare_pretraining_data(cfg,
                                        build_training_arguments(cfg,
                                                                 tmp_path, []))
    held = heldout_markers(cfg)
    vocabulary = set(prepared.tokenizer.get_vocab())
    assert held and not held & vocabulary  # each marker is only in its own document
    assert set(MARKERS) - held <= vocabulary


# The held-out set


def heldout_set(tokenizer, objective: str = "mlm", **extra):
    cfg = config(**{"objective": objective, "heldout.max_sequences": 200, **extra})
    return cfg, build_heldout(cfg.heldout, cfg.pretraining, cfg.objective, tokenizer,
                              documents_dataset(generated_documents(300)))


def test_heldout_masks_follow_the_fixed_rule_whatever_the_arm_masks(tokenizer):
    cfg, heldout = heldout_set(tokenizer)
    mlm = heldout.mlm
    assert set(mlm.column_names) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert len(mlm) == 200 and heldout.pairs is None
    special = set(tokenizer.all_special_ids)
    real = chosen = as_mask = unchanged = 0
    for row in mlm:
        ids, labels = np.array(row["input_ids"]), np.array(row["labels"])
        assert row["attention_mask"] == [1] * len(ids) and len(ids) <= 128
        predicted = labels != IGNORE_INDEX
        assert not set(labels[predicted]) & special
        real += sum(token not in special for token in labels[predicted]) + \
            sum(token not in special for token in ids[~predicted])
        chosen += predicted.sum()
        as_mask += (ids[predicted] == tokenizer.mask_token_id).sum()
        unchanged += (ids[predicted] == labels[predicted]).sum()
    assert chosen / real == pytest.approx(0.15, abs=0.01)
    assert as_mask / chosen == pytest.approx(0.8, abs=0.03)
    assert unchanged / chosen == pytest.approx(0.1, abs=0.03)  # a random draw rarely repeats
    # The arm's own masking, seed and sentence task change nothing of the MLM set.
    fingerprint = heldout_fingerprint(mlm)
    for extra in ({"masking": "dynamic", "masking.mlm_probability": 0.3}, {"seed": 7},
                  {"objective": "mlm_nsp"}):
        assert heldout_fingerprint(heldout_set(tokenizer, **extra)[1].mlm) == fingerprint
    assert heldout_fingerprint(heldout_set(tokenizer, **{"heldout.seed": 5})[1].mlm) \
        != fingerprint


# Scoring


def tiny_models(tokenizer):
    """bertkit's model and transformers' two classes, holding the same weights."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=128)
    ours = MaskedOnlyBertForPreTraining(config)
    pretraining = BertForPreTraining(config)
    pretraining.load_state_dict(ours.state_dict())
    masked_lm = BertForMaskedLM(config)
    missing, unexpected = masked_lm.load_state_dict(ours.state_dict(), strict=False)
    assert not missing and all(key.startswith(("bert.pooler", "cls.seq_relationship"))
                               for key in unexpected)
    return ours, pretraining, masked_lm


def independent_scores(masked_lm, pretraining, dataset) -> dict:
    """One example at a time, no padding: torch's cross-entropy on the masked positions of
    BertForMaskedLM's logits; NSP from BertForPreTraining's sentence logits."""
    losses, correct, nsp_losses, nsp_correct = [], [], [], []
    with torch.no_grad():
        for row in dataset:
            inputs = {name: torch.tensor([row[name]]) for name in
                      ("input_ids", "attention_mask", "token_type_ids")}
            labels = torch.tensor(row["labels"])
            logits = masked_lm.eval()(**inputs).logits[0]
            for position in torch.nonzero(labels != IGNORE_INDEX).flatten():
                target = labels[position]
                losses.append(float(functional.cross_entropy(logits[position], target)))
                correct.append(bool(logits[position].argmax() == target))
            if "next_sentence_label" in row:
                sentence = pretraining.eval()(**inputs).seq_relationship_logits[0]
                label = torch.tensor(row["next_sentence_label"])
                nsp_losses.append(float(functional.cross_entropy(sentence, label)))
                nsp_correct.append(bool(sentence.argmax() == label))
    scores = {"mlm_loss": np.mean(losses), "mlm_accuracy": np.mean(correct),
              "masked_positions": len(losses)}
    if nsp_losses:
        scores.update(nsp_loss=np.mean(nsp_losses), nsp_accuracy=np.mean(nsp_correct))
    return scores


def test_scores_agree_with_an_independent_computation_for_every_model_class(tokenizer):
    _, heldout = heldout_set(tokenizer, objective="mlm_nsp",
                             **{"heldout.max_sequences": 24})
    ours, pretraining, masked_lm = tiny_models(tokenizer)
    collator = heldout_collator(tokenizer)
    for dataset in (heldout.mlm, heldout.pairs):
        expected = independent_scores(masked_lm, pretraining, dataset)
        for model, batch_size in ((ours, 5), (ours, 24), (pretraining, 7), (masked_lm, 3)):
            model.train()
            scores = score_heldout(model, dataset, collator, batch_size, sentence_task="nsp")
            assert model.training  # its mode is given back
            assert scores["masked_positions"] == expected["masked_positions"]
            assert scores["sequences"] == len(dataset)
            assert scores["mlm_loss"] == pytest.approx(expected["mlm_loss"], rel=1e-5)
            assert scores["mlm_accuracy"] == pytest.approx(expected["mlm_accuracy"])
            if "next_sentence_label" in dataset.column_names and model is not masked_lm:
                assert scores["nsp_loss"] == pytest.approx(expected["nsp_loss"], rel=1e-5)
                assert scores["nsp_accuracy"] == pytest.approx(expected["nsp_accuracy"])
            else:
                assert "nsp_loss" not in scores


# Through pretraining runs


def tiny_run(**extra) -> list[str]:
    return small_run(**{"heldout.max_sequences": 32, "trainer.max_steps": 2, **extra})


def read_metrics(run_dir) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.slow
def test_every_arm_is_scored_on_the_same_heldout_positions(tmp_path):
    arms = {"static_nsp": {}, "dynamic_nsp": {"masking": "dynamic"},
            "static_mlm": {"objective": "mlm"}, "other_seed": {"seed": 7}}
    records = {}
    for name, extra in arms.items():
        pretrain(compose_config(tiny_run(**extra)), tmp_path / name)
        records[name] = read_metrics(tmp_path / name)["heldout"]
    keys = ("documents", "train_documents", "sequences", "masked_positions", "fingerprint")
    first = records["static_nsp"]
    assert first["documents"] > 0 and first["masked_positions"] > 0
    for record in records.values():
        assert {key: record[key] for key in keys} == {key: first[key] for key in keys}
    assert records["static_mlm"]["pairs"] is None
    assert records["dynamic_nsp"]["pairs"] == first["pairs"] == records["other_seed"]["pairs"]
    assert first["pairs"]["sentence_task"] == "nsp"
    # The benchmark's way outside the job: the same split, set and fingerprint.
    cfg = compose_config(tiny_run())
    _, heldout_docs = split_corpus(cfg)
    tokenizer = BertTokenizerFast.from_pretrained(str(tmp_path / "static_nsp" / "model"))
    heldout = build_heldout(cfg.heldout, cfg.pretraining, cfg.objective, tokenizer, heldout_docs)
    assert heldout_fingerprint(heldout.mlm) == first["fingerprint"]
    assert heldout_fingerprint(heldout.pairs) == first["pairs"]["fingerprint"]
    # A constant prediction's accuracy, beside which the NSP accuracy is read.
    labels = heldout.pairs["next_sentence_label"]
    assert first["pairs"]["majority_accuracy"] == pytest.approx(
        max(labels.count(0), labels.count(1)) / len(labels))


@pytest.mark.slow
def test_the_curve_has_step_zero_the_intervals_and_the_end_and_survives_a_resume(tmp_path):
    run_dir = tmp_path / "run"
    overrides = {"trainer.max_steps": 10, "heldout.every_steps": 4,
                 "heldout.every_seconds": "null", "trainer.save_steps": 2,
                 "trainer.save_strategy": "steps"}
    first = pretrain(compose_config(tiny_run(**overrides, train_fraction=0.4)), run_dir)
    assert [point["step"] for point in first["heldout"]["curve"]] == [0, 4]
    resumed = pretrain(compose_config(tiny_run(**overrides, resume=True)), run_dir)
    curve = resumed["heldout"]["curve"]
    # Step 4 was scored before its checkpoint was saved: not again after the resume.
    assert [point["step"] for point in curve] == [0, 4, 8, 10]
    assert curve[:2] == first["heldout"]["curve"]  # the evaluations before the resume
    assert resumed["heldout"]["final"] == curve[-1]
    assert read_metrics(run_dir)["heldout"]["final"] == curve[-1]
    tokens = [point["tokens_seen"] for point in curve]
    assert tokens[0] == 0 and tokens == sorted(tokens) and tokens[-1] == \
        resumed["train"]["tokens_seen"]
    for point in curve:
        assert {"mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy",
                "elapsed_seconds"} <= set(point)
    assert all("heldout/mlm_loss" not in line for line in resumed["log"])  # training lines


@pytest.mark.slow  # a pretraining run
def test_an_evaluation_keeps_the_training_log_line_of_its_step(tmp_path):
    """trainer.log from a callback resets Trainer's should_log: the training line of a step
    that is also evaluated must still be there."""
    record = pretrain(compose_config(tiny_run(**{
        "trainer.max_steps": 8, "heldout.every_steps": 2, "heldout.every_seconds": "null",
        "trainer.logging_steps": 2, "trainer.logging_first_step": False})), tmp_path / "run")
    assert [line["step"] for line in record["log"]] == [2, 4, 6, 8]
    assert [point["step"] for point in record["heldout"]["curve"]] == [0, 2, 4, 6, 8]


@pytest.mark.slow  # a pretraining run
def test_evaluations_follow_training_time_and_do_not_consume_it(tmp_path, monkeypatch):
    """A fake clock: each training forward pass takes 10 s, each evaluation forward 100 s;
    every 25 s of training an evaluation, none of whose time is counted."""
    now = {"seconds": 0.0}
    forward = MaskedOnlyBertForPreTraining.forward

    @functools.wraps(forward)  # Trainer reads the signature to keep the model's columns
    def timed_forward(self, *args, **kwargs):
        now["seconds"] += 10.0 if self.training else 100.0
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(MaskedOnlyBertForPreTraining, "forward", timed_forward)
    monkeypatch.setattr(training_run, "training_clock",
                        lambda: TrainingClock(time_fn=lambda: now["seconds"]))
    summary = pretrain(compose_config(tiny_run(**{
        "trainer.max_steps": 8, "heldout.every_seconds": 25, "heldout.batch_size": 64})),
        tmp_path / "run")
    curve = summary["heldout"]["curve"]
    assert [point["step"] for point in curve] == [0, 3, 6, 8]
    assert [point["elapsed_seconds"] for point in curve] == [0.0, 30.0, 60.0, 80.0]


# Settings


# A value out of its range (the schema's, also_when_off) is refused whether the held-out set
# is on or not; a rule between settings only with the held-out set on.
@pytest.mark.parametrize(("override", "message", "also_when_off"), [
    ({"heldout.fraction": 1.0}, "heldout.fraction=1.0", False),
    ({"heldout.every_steps": 10}, "give exactly one", False),
    ({"heldout.every_seconds": "null"}, "give exactly one", False),
    ({"heldout.every_seconds": -1}, "heldout.every_seconds=-1", True),
    ({"heldout.max_sequences": 0}, "heldout.max_sequences=0", True),
    ({"heldout.min_documents": 0}, "heldout.min_documents=0", True),
    ({"heldout.masking.mlm_probability": 1.5}, "heldout.masking.mlm_probability=1.5", True),
    ({"corpus": "wikipedia", "corpus.hub.streaming": True, "masking": "dynamic"},
     "heldout.fraction>0 with corpus.hub.streaming=true", False),
])
def test_heldout_settings_are_checked_before_any_data_is_read(override, message,
                                                              also_when_off):
    pattern = message.replace(".", r"\.").replace("(", r"\(")
    with pytest.raises(BertkitError, match=pattern):
        check_pretraining_config(config(**override))
    off = config(**{**override, "heldout.fraction": 0})
    if also_when_off:
        with pytest.raises(BertkitError, match=pattern):
            check_pretraining_config(off)
    else:
        check_pretraining_config(off)


def test_a_plain_trainer_and_masked_lm_get_the_same_curve_callback(tokenizer, tmp_path):
    """The benchmark's way: transformers' Trainer and BertForMaskedLM, the callback given the
    tokenizer, the clock started by the ClockCallback."""
    _, heldout = heldout_set(tokenizer, **{"heldout.max_sequences": 16})
    _, _, masked_lm = tiny_models(tokenizer)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             report_to=[], save_strategy="no", disable_tqdm=True,
                             use_cpu=True, include_num_input_tokens_seen="non_padding")
    trainer = Trainer(model=masked_lm, args=args, train_dataset=heldout.mlm,
                      data_collator=heldout_collator(tokenizer))
    clock = TrainingClock()
    trainer.add_callback(ClockCallback(clock, None))
    trainer.add_callback(HeldoutEvaluation(trainer, heldout, clock, batch_size=8, every_steps=3,
                                           tokenizer=tokenizer))
    trainer.train()
    curve = heldout_curve(trainer.state.log_history)
    assert [point["step"] for point in curve] == [0, 3, 4]
    assert curve[0]["tokens_seen"] == 0 < curve[-1]["tokens_seen"]
    assert curve[-1]["mlm_loss"] == pytest.approx(
        score_heldout(masked_lm, heldout.mlm, heldout_collator(tokenizer), 5)["mlm_loss"])
    assert "nsp_loss" not in curve[-1]
