"""A generated pretraining corpus, so tests and the offline demo pretrain with no files at all.

Written in Google's format (one sentence per line, a blank line between documents). Each
document has a topic: its sentences take nouns, verbs and adjectives from that topic's words,
and function words from lists shared by all topics, in a fixed grammar
(determiner [adjective] noun verb determiner [adjective] noun, then prepositional phrases and
adverbs). A sentence's subject is the previous sentence's object or subject, so consecutive
sentences continue each other. A tiny BERT therefore learns masked words (grammar and topic
predict them) and next-sentence prediction (a random sentence from another document rarely
shares its topic, and never shares the repeated noun) within a few hundred steps.
"""

from __future__ import annotations

import random
from pathlib import Path

from bertkit.config_schema import check_setting
from bertkit.data.atomic_files import write_text_atomic
from bertkit.errors import BertkitError

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCTUATION = ["."]
DETERMINERS = ["the", "this", "that", "every", "one", "each", "another"]
PREPOSITIONS = ["near", "behind", "beside", "under", "above", "inside", "past", "toward", "with",
                "without"]
ADVERBS = ["again", "today", "slowly", "quietly", "quickly", "often", "carefully", "soon",
           "later", "twice"]
FUNCTION_WORDS = DETERMINERS + PREPOSITIONS + ADVERBS
# Each topic's nouns, transitive past-tense verbs and adjectives; no word is in two topics.
TOPICS: dict[str, dict[str, list[str]]] = {
    "sea": {
        "nouns": ["ship", "sailor", "captain", "harbor", "wave", "anchor", "island", "whale",
                  "dolphin", "lighthouse", "net", "fisherman", "shell", "reef"],
        "verbs": ["steered", "rowed", "anchored", "sailed", "spotted", "towed", "hauled", "moored"],
        "adjectives": ["salty", "stormy", "coastal", "tidal", "wet", "blue", "sandy", "nautical"],
    },
    "forest": {
        "nouns": ["tree", "owl", "fox", "deer", "oak", "pine", "squirrel", "mushroom", "branch",
                  "moss", "hunter", "trail", "bear", "acorn"],
        "verbs": ["climbed", "hid", "chased", "sniffed", "gathered", "buried", "followed",
                  "tracked"],
        "adjectives": ["leafy", "shady", "wild", "mossy", "tall", "green", "dense", "ancient"],
    },
    "kitchen": {
        "nouns": ["cook", "chef", "pan", "pot", "oven", "knife", "onion", "soup", "bread", "spoon",
                  "plate", "sauce", "butter", "stove"],
        "verbs": ["stirred", "chopped", "baked", "boiled", "tasted", "seasoned", "sliced", "fried"],
        "adjectives": ["hot", "spicy", "fresh", "crispy", "sweet", "sour", "greasy", "tender"],
    },
    "city": {
        "nouns": ["taxi", "bus", "driver", "street", "tower", "mayor", "bridge", "subway", "shop",
                  "crowd", "office", "banker", "traffic", "sidewalk"],
        "verbs": ["parked", "crossed", "built", "closed", "opened", "managed", "passed",
                  "blocked"],
        "adjectives": ["busy", "noisy", "crowded", "urban", "modern", "concrete", "narrow",
                       "expensive"],
    },
    "farm": {
        "nouns": ["farmer", "cow", "barn", "tractor", "horse", "sheep", "pig", "hay", "field",
                  "fence", "goat", "chicken", "plow", "wheat"],
        "verbs": ["milked", "plowed", "fed", "harvested", "herded", "sheared", "planted",
                  "watered"],
        "adjectives": ["muddy", "rural", "dusty", "ripe", "golden", "fat", "woolly", "rusty"],
    },
    "space": {
        "nouns": ["rocket", "astronaut", "planet", "star", "moon", "comet", "orbit", "satellite",
                  "galaxy", "telescope", "asteroid", "crater", "capsule", "alien"],
        "verbs": ["launched", "orbited", "observed", "landed", "explored", "photographed",
                  "circled", "detected"],
        "adjectives": ["distant", "cosmic", "lunar", "orbital", "bright", "frozen", "silent",
                       "vast"],
    },
    "school": {
        "nouns": ["teacher", "student", "pupil", "lesson", "book", "desk", "pencil", "chalk",
                  "classroom", "exam", "homework", "principal", "library", "notebook"],
        "verbs": ["read", "wrote", "studied", "graded", "taught", "copied", "erased",
                  "memorized"],
        "adjectives": ["clever", "curious", "difficult", "easy", "strict", "boring", "neat",
                       "diligent"],
    },
    "music": {
        "nouns": ["guitar", "piano", "drum", "singer", "band", "song", "violin", "melody",
                  "concert", "drummer", "choir", "trumpet", "rhythm", "stage"],
        "verbs": ["played", "sang", "tuned", "strummed", "composed", "rehearsed", "recorded",
                  "performed"],
        "adjectives": ["loud", "soft", "musical", "catchy", "harmonic", "acoustic", "lively",
                       "melodic"],
    },
    "hospital": {
        "nouns": ["doctor", "nurse", "patient", "surgeon", "bandage", "medicine", "wound",
                  "ambulance", "clinic", "fever", "pill", "syringe", "ward", "stretcher"],
        "verbs": ["treated", "examined", "healed", "cured", "bandaged", "injected", "diagnosed",
                  "checked"],
        "adjectives": ["sick", "injured", "sterile", "medical", "pale", "weak", "feverish",
                       "healthy"],
    },
    "mountain": {
        "nouns": ["climber", "peak", "summit", "cliff", "rope", "glacier", "ridge", "boulder",
                  "valley", "cave", "avalanche", "eagle", "tent", "snow"],
        "verbs": ["scaled", "reached", "descended", "pitched", "traversed", "conquered", "mapped",
                  "surveyed"],
        "adjectives": ["steep", "rocky", "icy", "snowy", "windy", "alpine", "high", "cold"],
    },
}
# determiner noun verb determiner noun: the shortest sentence the grammar makes.
CORE_WORDS = 5


class _NounPhrase:
    def __init__(self, determiner: str, noun: str) -> None:
        self.determiner, self.adjective, self.noun = determiner, None, noun

    def words(self) -> list[str]:
        return [self.determiner] + ([self.adjective] if self.adjective else []) + [self.noun]


def _sentence(rng: random.Random, topic: dict[str, list[str]], subject: str, length: int,
              continued: bool) -> tuple[str, str]:
    """One sentence of exactly `length` words about `subject`; returns it and its object."""
    obj = rng.choice([noun for noun in topic["nouns"] if noun != subject])
    # "the" for the noun carried over from the previous sentence, as English marks given things.
    phrases = [_NounPhrase("the" if continued else rng.choice(DETERMINERS), subject),
               _NounPhrase(rng.choice(DETERMINERS), obj)]
    verb = rng.choice(topic["verbs"])
    prepositional: list[tuple[str, _NounPhrase]] = []
    adverbs: list[str] = []
    count = CORE_WORDS
    while count < length:
        bare = [phrase for phrase in phrases if phrase.adjective is None]
        choices = (["preposition"] if length - count >= 3 else []) + (["adjective"] if bare else [])
        if not adverbs or not choices:
            choices.append("adverb")
        choice = rng.choice(choices)
        if choice == "preposition":
            phrase = _NounPhrase(rng.choice(DETERMINERS), rng.choice(topic["nouns"]))
            prepositional.append((rng.choice(PREPOSITIONS), phrase))
            phrases.append(phrase)
            count += 3
        elif choice == "adjective":
            rng.choice(bare).adjective = rng.choice(topic["adjectives"])
            count += 1
        else:
            adverbs.append(rng.choice(ADVERBS))
            count += 1
    words = phrases[0].words() + [verb] + phrases[1].words()
    for preposition, phrase in prepositional:
        words += [preposition] + phrase.words()
    return " ".join(words + adverbs) + ".", obj


def _document(rng: random.Random, topic: dict[str, list[str]], num_sentences: int,
              min_words: int, max_words: int) -> list[str]:
    sentences: list[str] = []
    subject = rng.choice(topic["nouns"])
    for index in range(num_sentences):
        sentence, obj = _sentence(rng, topic, subject, rng.randint(min_words, max_words),
                                  continued=index > 0)
        sentences.append(sentence)
        # The next sentence goes on about this one's object, or stays with its subject.
        subject = obj if rng.random() < 0.7 else subject
    return sentences


def _check(num_documents: int, min_sentences: int, max_sentences: int, min_words: int,
           max_words: int, num_topics: int) -> None:
    key = "corpus.synthetic"
    check_setting(f"{key}.num_documents", num_documents)  # the schema's range
    if not 1 <= min_sentences <= max_sentences:
        raise BertkitError(f"{key}.min_sentences={min_sentences}, max_sentences={max_sentences}: "
                           f"need 1 <= min_sentences <= max_sentences")
    if not CORE_WORDS <= min_words <= max_words:
        raise BertkitError(f"{key}.min_words={min_words}, max_words={max_words}: need "
                           f"{CORE_WORDS} <= min_words <= max_words (the shortest sentence)")
    if not 1 <= num_topics <= len(TOPICS):
        raise BertkitError(f"{key}.num_topics={num_topics}: must be between 1 and {len(TOPICS)}")


def write_demo_corpus(path: Path, *, num_documents: int, min_sentences: int, max_sentences: int,
                      min_words: int, max_words: int, num_topics: int, seed: int) -> Path:
    """Write the corpus to path atomically; the same settings always give the same bytes."""
    _check(num_documents, min_sentences, max_sentences, min_words, max_words, num_topics)
    rng = random.Random(seed)
    topics = list(TOPICS.values())[:num_topics]
    documents = [
        _document(rng, rng.choice(topics), rng.randint(min_sentences, max_sentences),
                  min_words, max_words)
        for _ in range(num_documents)
    ]
    return write_text_atomic(path, "\n\n".join("\n".join(doc) for doc in documents) + "\n")


def demo_vocabulary() -> list[str]:
    """A whole-word WordPiece vocab: special tokens first ([PAD] is id 0), then every word."""
    words = set(FUNCTION_WORDS)
    for topic in TOPICS.values():
        for word_list in topic.values():
            words.update(word_list)
    return SPECIAL_TOKENS + PUNCTUATION + sorted(words)


def ensure_demo_corpus(path: str | Path, settings: dict) -> Path:
    """Write the corpus, and vocab.txt beside it, unless they are already there."""
    path = Path(path)
    if not path.is_file():
        write_demo_corpus(path, **settings)
    vocab = path.parent / "vocab.txt"
    if not vocab.is_file():
        write_text_atomic(vocab, "\n".join(demo_vocabulary()) + "\n")
    return path
