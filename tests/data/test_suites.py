import random
import re
from collections import defaultdict

import pytest

from hypic.data.language import RELATIONS, is_held_out_fact, split_subjects
from hypic.data.request import PIC_SEP
from hypic.data.suites import TASKS, DocumentPool, SuiteConfig, fresh_request, generate_suite, zipf_sample
from hypic.data.training import CURRICULUM, TrainingStream
from hypic.data.vocab import NAMES, build_tokenizer, vocabulary

SMALL = dict(min_docs=4, max_docs=8, min_doc_tokens=64, max_doc_tokens=128, pool_size=40)

_FACT_PATTERNS = {
    "lives": re.compile(r"(\w+) lives in (\w+) \."),
    "job": re.compile(r"(\w+) works as a (\w+) \."),
    "color": re.compile(r"(\w+) likes the color (\w+) \."),
    "animal": re.compile(r"(\w+) owns a (\w+) \."),
    "mentor": re.compile(r"the mentor of (\w+) is (\w+) \."),
}
_HEAD = re.compile(r"this passage is about (\w+) \.")


def parse_facts(text):
    """All (subject, relation, value) facts stated in a document text."""
    return {(s, rel, v) for rel, pat in _FACT_PATTERNS.items() for s, v in pat.findall(text)}


def subject_of(text):
    return _HEAD.search(text).group(1)


def test_determinism_by_seed():
    for task in TASKS:
        a = generate_suite(SuiteConfig(task=task, seed=3, **SMALL), 12)
        b = generate_suite(SuiteConfig(task=task, seed=3, **SMALL), 12)
        c = generate_suite(SuiteConfig(task=task, seed=4, **SMALL), 12)
        assert a == b
        assert [r.prompt() for r in a] != [r.prompt() for r in c]
    s1, s2 = TrainingStream(CURRICULUM[2], seed=5), TrainingStream(CURRICULUM[2], seed=5)
    assert s1.take(5) == s2.take(5)


def test_request_shapes_and_lengths():
    for task in TASKS:
        for r in generate_suite(SuiteConfig(task=task, **SMALL), 20):
            assert 4 <= r.num_documents <= 8
            assert all(64 <= len(d.split()) <= 128 for d in r.documents)
            assert r.prompt().count(PIC_SEP) == r.num_documents
            assert len(set(subject_of(d) for d in r.documents)) == r.num_documents
            # Segment-wise tokenisation equals whole-text tokenisation (word level).
            tok = build_tokenizer()
            assert sum((tok.encode(s).ids for s in r.segments()), []) == tok.encode(r.plain_text()).ids


def test_documents_recur_in_different_positions():
    reqs = generate_suite(SuiteConfig(task="single_hop", **SMALL), 40)
    positions = defaultdict(set)
    for r in reqs:
        for pos, doc_id in enumerate(r.doc_ids):
            positions[doc_id].add(pos)
    counts = [len(p) for p in positions.values()]
    assert max(counts) >= 3, "popular documents should appear at several positions"


def test_zipf_sample_prefers_low_ranks_and_excludes():
    rng = random.Random(0)
    hits = defaultdict(int)
    for _ in range(300):
        picked = zipf_sample(rng, 50, 5, 1.0, exclude=[1])
        assert len(set(picked)) == 5 and 1 not in picked
        for i in picked:
            hits[i] += 1
    assert hits[0] > hits[40]
    with pytest.raises(ValueError, match="count"):
        zipf_sample(rng, 5, 5, 1.0, exclude=[0])


def _training_texts(num_per_stage=60):
    docs, tokens = [], set()
    for stage in CURRICULUM:
        stream = TrainingStream(stage, seed=11)
        for _ in range(num_per_stage):
            r = stream.next_request()
            docs.extend(r.documents)
            for seg in r.segments() + r.answers:
                tokens.update(seg.split())
    return docs, tokens


def test_held_out_separation():
    held_out_docs = set()
    held_out_facts = set()
    for task in TASKS:
        for r in generate_suite(SuiteConfig(task=task, **SMALL), 25):
            for d in r.documents:
                facts = parse_facts(d)
                assert len(facts) == len(RELATIONS)
                assert all(is_held_out_fact(*f) for f in facts)
                held_out_facts |= facts
                held_out_docs.add(d)
    train_docs, _ = _training_texts()
    train_facts = set()
    for d in train_docs:
        facts = parse_facts(d)
        assert not any(is_held_out_fact(*f) for f in facts)
        train_facts |= facts
    assert not held_out_facts & train_facts
    assert not held_out_docs & set(train_docs)
    # The training split's own pool is disjoint from the held-out pool too.
    train_pool = DocumentPool("train", 0, 40, 64, 128)
    assert not {d.text for d in train_pool.documents} & held_out_docs


def test_vocabulary_closure():
    vocab = vocabulary()
    _, train_tokens = _training_texts()
    # Every name can be a training subject, so every name token is trained.
    assert set(split_subjects("train")) == set(NAMES)
    for task in TASKS:
        for r in generate_suite(SuiteConfig(task=task, **SMALL), 25):
            words = set(" ".join(r.segments() + r.answers).split())
            assert words <= set(vocab)
            assert words <= train_tokens | set(NAMES), sorted(words - train_tokens - set(NAMES))


def _docs_by_subject(r):
    out = defaultdict(list)
    for d in r.documents:
        out[subject_of(d)].append(d)
    return out


_SINGLE_Q = {
    "lives": re.compile(r"where does (\w+) live \?"),
    "job": re.compile(r"what is the job of (\w+) \?"),
    "color": re.compile(r"what color does (\w+) like \?"),
    "animal": re.compile(r"what animal does (\w+) own \?"),
    "mentor": re.compile(r"who is the mentor of (\w+) \?"),
}


def _single_hop_question(query):
    for rel, pat in _SINGLE_Q.items():
        m = pat.search(query)
        if m and "the mentor of" not in query.replace("who is the mentor of", ""):
            return rel, m.group(1)
    raise AssertionError(f"unparsed query {query!r}")


def _two_hop_question(query):
    for rel, pat in _SINGLE_Q.items():
        m = re.search(pat.pattern.replace(r"(\w+)", r"the mentor of (\w+)"), query)
        if m:
            return rel, m.group(1)
    raise AssertionError(f"unparsed query {query!r}")


def _answer_in_context_single(r):
    rel, subject = _single_hop_question(r.query)
    docs = _docs_by_subject(r)[subject]
    assert len(docs) == 1
    stated = [f for d in r.documents for f in parse_facts(d) if f[0] == subject and f[1] == rel]
    assert stated == [(subject, rel, r.answers[0])]


def _answer_in_context_two_hop(r):
    rel, source = _two_hop_question(r.query)
    mentors = [f[2] for d in r.documents for f in parse_facts(d) if f[0] == source and f[1] == "mentor"]
    assert len(mentors) == 1
    bridge = mentors[0]
    assert len(_docs_by_subject(r)[bridge]) == 1
    stated = [f for d in r.documents for f in parse_facts(d) if f[0] == bridge and f[1] == rel]
    assert len(stated) == 1
    # The answer spells out the bridge, then the fact: "<mentor> <fact words> <value>".
    words = r.answers[0].split()
    assert words[0] == bridge and words[-1] == stated[0][2]
    assert r.answers[0] + " ." in r.documents[[subject_of(d) for d in r.documents].index(bridge)]
    # The answer is not reachable in one hop: the source's own fact differs or is another relation.
    assert bridge != source


def test_answer_in_context_suites():
    for r in generate_suite(SuiteConfig(task="single_hop", **SMALL), 30):
        _answer_in_context_single(r)
    for r in generate_suite(SuiteConfig(task="two_hop", **SMALL), 30):
        _answer_in_context_two_hop(r)
    for r in generate_suite(SuiteConfig(task="summary", **SMALL), 10):
        assert r.answers[0].split() == [subject_of(d) for d in r.documents]


def test_answer_in_context_fresh_training_requests():
    rng = random.Random(7)
    for _ in range(30):
        _answer_in_context_single(fresh_request(rng, "single_hop", rng.randint(1, 6), 36, 80))
        _answer_in_context_two_hop(fresh_request(rng, "two_hop", rng.randint(2, 6), 36, 80))
    copy = fresh_request(rng, "copy", 0, 36, 36, copy_length=(3, 3))
    assert copy.documents[0].split()[3:-1] == copy.answers[0].split()
    for _ in range(10):
        recall = fresh_request(rng, "recall", 0, 36, 36, recall_pairs=(2, 5))
        words = recall.documents[0].split()[3:-1]
        pairs = dict(zip(words[0::2], words[1::2]))
        assert 2 <= len(pairs) <= 5 and len(words) == 2 * len(pairs)  # keys are distinct
        key = recall.query.split()[-4]
        assert pairs[key] == recall.answers[0]


@pytest.mark.parametrize("overrides, field", [
    (dict(task="qa"), "task"),
    (dict(split="dev"), "split"),
    (dict(min_docs=1), "min_docs"),
    (dict(max_docs=3), "max_docs"),
    (dict(min_doc_tokens=200, max_doc_tokens=100), "min_doc_tokens"),
    (dict(max_doc_tokens=10), "max_doc_tokens"),
    (dict(pool_size=10), "pool_size"),
    (dict(zipf_exponent=-1.0), "zipf_exponent"),
])
def test_suite_config_validation(overrides, field):
    fields = dict(task="single_hop", **SMALL)
    fields.update(overrides)
    with pytest.raises(ValueError, match=field):
        SuiteConfig(**fields)


def _answer_in_context_order(r):
    m = re.search(r"who follows (\w+) in order \?", r.query)
    assert m, r.query
    subjects = [subject_of(d) for d in r.documents]
    assert subjects.count(m.group(1)) == 1
    i = subjects.index(m.group(1))
    assert i + 1 < len(subjects) and r.answers == (subjects[i + 1],)


def test_order_lookup_answer_is_the_next_passage_subject():
    for r in generate_suite(SuiteConfig(task="order_lookup", **SMALL), 30):
        _answer_in_context_order(r)
        assert r.metric == "exact_match"
    rng = random.Random(3)
    for _ in range(30):
        _answer_in_context_order(fresh_request(rng, "order_lookup", rng.randint(2, 6), 36, 80))
    with pytest.raises(ValueError, match="num_docs"):
        fresh_request(rng, "order_lookup", 1, 36, 80)


def test_order_lookup_depends_on_document_order():
    """The same documents in reverse order give a different answer for the same question."""
    r = generate_suite(SuiteConfig(task="order_lookup", **SMALL), 1)[0]
    subjects = [subject_of(d) for d in r.documents]
    asked = re.search(r"who follows (\w+) in order", r.query).group(1)
    reversed_subjects = subjects[::-1]
    j = reversed_subjects.index(asked)
    if j + 1 < len(reversed_subjects):
        assert reversed_subjects[j + 1] != r.answers[0]


def test_bridge_answer_spells_out_the_bridge():
    from hypic.data.language import bridge_answer

    assert bridge_answer("palan", "lives", "santon") == "palan lives in santon"
    assert bridge_answer("palan", "job", "banker") == "palan works as a banker"
    with pytest.raises(ValueError, match="relation"):
        bridge_answer("palan", "mentor", "bipur")  # a bridge question asks an attribute, not a person
