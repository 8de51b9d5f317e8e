"""The embedded default corpus: English-like text from a small probabilistic grammar.

The grammar is a *unifilar* probabilistic finite-state source: in each state it draws one word,
and (state, word) determines the next state. Two consequences matter here:

* The state is a function of the word history (every sentence end resets it), so a model that
  reads the text can know it. The best possible predictor is therefore p(word | state).
* Its entropy rate per word has a closed form (Shannon 1948, Part I §7 for Markov sources; Cover &
  Thomas, *Elements of Information Theory*, §4.2, for a function-of-state unifilar chain):
      H_word = sum_s pi(s) * H(p(. | s))          [nats per word]
  with pi the stationary distribution of the state chain.

The text is the concatenation of one emission string per word (a separator, the word, possibly
capitalized). The map from word sequences to bytes is injective and parses left to right, so the
byte stream carries exactly the same information, spread over E[L] bytes per word on average:
      H_byte = H_word / E[L],   E[L] = sum_s pi(s) sum_w p(w | s) * len(emit(s, w))
(a renewal argument: n bytes hold about n / E[L] words, and the bytes determine those words up to
one partial word at the end). For a lossless tokenizer the per-token rate is H_byte times the
corpus' bytes per token. This is an *asymptotic* rate: a model with a finite context loses a
little at the first few positions of each window, where the state is not yet known.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Grammar", "default_grammar", "generate_text"]

# Word classes. Plain English words written for this project; each list is ordered from most to
# least frequent (the in-class distribution below is Zipf-like over this order).
_CLASSES: dict[str, str] = {
    "DET": "the this that every each one my your his our their",
    "NOUN": "cat dog bird fish horse cow sheep goat fox wolf bear mouse rabbit frog duck owl "
    "lion tiger snake whale child man woman boy girl farmer baker teacher doctor sailor "
    "king queen knight wizard robot pilot painter singer poet miner hunter driver cook "
    "friend stranger neighbor river forest garden house castle tower bridge village city "
    "road hill mountain lake field boat ship train car wagon lamp book letter map key door "
    "window table chair bell drum song story dream storm cloud star moon sun apple bread "
    "cake cheese coin ring sword shield hat coat shoe basket box stone tree flower leaf",
    "ADJ": "big small old young red blue green black white happy sad quiet loud brave tiny huge "
    "bright dark cold warm wise silly lazy busy clever gentle angry hungry sleepy strange "
    "proud shy kind rich poor tall short fast slow golden",
    "VT": "sees likes finds follows helps watches carries paints hears knows loves hides builds "
    "opens holds chases calls visits feeds wants needs takes brings pushes pulls keeps meets "
    "greets thanks draws catches buys sells cleans fixes reads writes counts",
    "VI": "runs sleeps sings laughs waits walks smiles jumps swims dances falls cries rests hums "
    "shouts wanders works plays listens dreams glows shines",
    "ADV": "quickly slowly quietly loudly happily sadly often again today tonight early late "
    "gladly softly badly well together alone carefully",
    "PREP": "in on under near behind beside over across through into from with past",
    "NAME": "Anna Ben Clara David Emma Felix Grace Henry Iris Jack Lucy Max Nora Oscar Ruby Sam",
    "PRON_S": "he she it",
    "PRON_O": "him her it them me us",
    "CONJ": "and but so while because",
    "STOP": ".",
    "PARA": ".\n",
}

# state -> [(class, probability of the class, next state)]. Sentence: subject, verb, optional
# object, optional adverb / prepositional phrase, end or conjunction. START follows ". ",
# LINE follows ".\n" (no leading space), CLAUSE follows a conjunction (no capital).
_SUBJECT = [("DET", 0.6, "SDET"), ("NAME", 0.25, "VERB"), ("PRON_S", 0.15, "VERB")]
_FINISH = [("STOP", 0.75, "START"), ("PARA", 0.13, "LINE"), ("CONJ", 0.12, "CLAUSE")]
_TRANSITIONS: dict[str, list[tuple[str, float, str]]] = {
    "START": _SUBJECT,
    "LINE": _SUBJECT,
    "CLAUSE": _SUBJECT,
    "SDET": [("ADJ", 0.35, "SADJ"), ("NOUN", 0.65, "VERB")],
    "SADJ": [("ADJ", 0.15, "SADJ2"), ("NOUN", 0.85, "VERB")],
    "SADJ2": [("NOUN", 1.0, "VERB")],
    "VERB": [("VT", 0.6, "OBJ"), ("VI", 0.4, "VI_AFTER")],
    "OBJ": [("DET", 0.65, "ODET"), ("NAME", 0.2, "END"), ("PRON_O", 0.15, "END")],
    "ODET": [("ADJ", 0.3, "OADJ"), ("NOUN", 0.7, "END")],
    "OADJ": [("NOUN", 1.0, "END")],
    "VI_AFTER": [
        ("ADV", 0.3, "END2"),
        ("PREP", 0.3, "PP"),
        ("STOP", 0.3, "START"),
        ("PARA", 0.05, "LINE"),
        ("CONJ", 0.05, "CLAUSE"),
    ],
    "END": [
        ("PREP", 0.25, "PP"),
        ("ADV", 0.2, "END2"),
        ("STOP", 0.4, "START"),
        ("PARA", 0.08, "LINE"),
        ("CONJ", 0.07, "CLAUSE"),
    ],
    "PP": [("DET", 0.85, "PDET"), ("NAME", 0.15, "END2")],
    "PDET": [("ADJ", 0.25, "PADJ"), ("NOUN", 0.75, "END2")],
    "PADJ": [("NOUN", 1.0, "END2")],
    "END2": _FINISH,
}
_CAPITALIZE = {"START", "LINE"}
_NO_SPACE_STATES = {"LINE"}
_PUNCTUATION = {".", ".\n"}


def _zipf(n: int) -> np.ndarray:
    """In-class word distribution p(rank k) proportional to 1 / (k + 2): skewed, like text."""
    w = 1.0 / (np.arange(n) + 2.0)
    return w / w.sum()


@dataclass(frozen=True)
class Grammar:
    """A unifilar probabilistic finite-state source over words (see the module docstring)."""

    states: tuple[str, ...]
    words: tuple[tuple[str, ...], ...]
    """Per state: the words it can emit (merged across classes)."""
    probs: tuple[np.ndarray, ...]
    """Per state: p(word | state), aligned with `words`."""
    next_state: tuple[tuple[int, ...], ...]
    """Per state: index of the next state after each word."""
    start: int

    def emit(self, state: int, word: str) -> str:
        """The text a word produces in a state: separator + (capitalized) word."""
        name = self.states[state]
        if word in _PUNCTUATION:
            return word
        text = word[0].upper() + word[1:] if name in _CAPITALIZE else word
        return text if name in _NO_SPACE_STATES else " " + text

    def transition_matrix(self) -> np.ndarray:
        """(S, S) state-to-state probabilities."""
        num = len(self.states)
        t = np.zeros((num, num))
        for s in range(num):
            np.add.at(t[s], list(self.next_state[s]), self.probs[s])
        return t

    def stationary(self) -> np.ndarray:
        """Stationary distribution pi (pi T = pi): left eigenvector of T for eigenvalue 1."""
        t = self.transition_matrix()
        vals, vecs = np.linalg.eig(t.T)
        v = np.real(vecs[:, np.argmin(np.abs(vals - 1.0))])
        return v / v.sum()

    def entropy_per_word(self) -> float:
        """H_word = sum_s pi(s) H(p(.|s)), nats per word (exact for a unifilar source)."""
        pi = self.stationary()
        return float(sum(pi[s] * -(p * np.log(p)).sum() for s, p in enumerate(self.probs)))

    def bytes_per_word(self) -> float:
        """E[L]: mean UTF-8 bytes one word emits, separators and punctuation included."""
        pi = self.stationary()
        total = 0.0
        for s, (ws, p) in enumerate(zip(self.words, self.probs)):
            lengths = np.array([len(self.emit(s, w).encode()) for w in ws], dtype=float)
            total += pi[s] * float((p * lengths).sum())
        return total

    def entropy_per_byte(self) -> float:
        """H_byte = H_word / E[L], nats per byte: the best achievable byte-level loss."""
        return self.entropy_per_word() / self.bytes_per_word()


def default_grammar() -> Grammar:
    """Build the embedded grammar, checking it is unifilar (a word never leads two ways)."""
    names = tuple(_TRANSITIONS)
    index = {n: i for i, n in enumerate(names)}
    words, probs, nexts = [], [], []
    for name in names:
        merged: dict[str, list] = {}
        for cls, p_cls, nxt in _TRANSITIONS[name]:
            vocab = _CLASSES[cls].split(" ") if cls not in ("STOP", "PARA") else [_CLASSES[cls]]
            for w, p in zip(vocab, _zipf(len(vocab))):
                entry = merged.setdefault(w, [0.0, index[nxt]])
                assert entry[1] == index[nxt], f"{name}: {w!r} leads to two states"
                entry[0] += p_cls * p
        words.append(tuple(merged))
        p = np.array([v[0] for v in merged.values()])
        assert math.isclose(p.sum(), 1.0), name
        probs.append(p / p.sum())
        nexts.append(tuple(v[1] for v in merged.values()))
    return Grammar(names, tuple(words), tuple(probs), tuple(nexts), index["LINE"])


def generate_text(num_bytes: int, seed: int, grammar: Grammar | None = None) -> str:
    """Exactly `num_bytes` bytes of ASCII text sampled from the grammar (deterministic in seed).

    Sampling draws uniforms in numpy blocks and inverts per-state CDFs with `bisect`; the chain
    is sequential, so this is a plain loop (~0.3 M words/s).
    """
    g = grammar or default_grammar()
    rng = np.random.default_rng(seed)
    cdfs = [np.cumsum(p).tolist() for p in g.probs]
    for c in cdfs:
        c[-1] = 1.0 + 1e-12  # guard against round-off so bisect never runs off the end
    emits = [[g.emit(s, w) for w in ws] for s, ws in enumerate(g.words)]
    pieces: list[str] = []
    size, state = 0, g.start
    while size < num_bytes:
        for u in rng.random(65536).tolist():
            k = bisect.bisect_right(cdfs[state], u)
            text = emits[state][k]
            pieces.append(text)
            size += len(text)
            state = g.next_state[state][k]
            if size >= num_bytes:
                break
    return "".join(pieces)[:num_bytes]
