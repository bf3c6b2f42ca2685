"""The embedded task and user datasets, all offline."""

import pandas as pd
import pytest
import torch

from optbench.workloads import data, reviews
from optbench.workloads.classify import classification_metrics, eval_bounds


def test_embedded_task_is_seeded_balanced_and_compositional():
    a, b = data.generate_reviews(600, seed=7), data.generate_reviews(600, seed=7)
    assert a["text"] == b["text"] and a["label"] == b["label"]
    counts = pd.Series(a["label"]).value_counts()
    assert set(counts.index) == {0, 1, 2} and counts.min() > 150
    texts = " ".join(a["text"])
    for marker in (" but ", "although ", "even though ", " not ", "could have been", "it is not true that"):
        assert marker in texts
    invented = {word for words in reviews.invented_lexicon().values() for word in words}
    assert sum(word in invented for word in texts.replace(",", " ").replace(".", " ").split()) > 100


def test_the_invented_lexicon_is_new_words_of_each_polarity():
    lexicon = reviews.invented_lexicon()
    words = [word for polarity in (-1, 0, 1) for word in lexicon[polarity]]
    assert len(words) == len(set(words)) == 3 * reviews.NONCE_PER_POLARITY
    assert not set(words) & set(reviews._POSITIVE + reviews._NEGATIVE + reviews._NEUTRAL)


def test_the_clean_label_is_a_function_of_the_text():
    """No text carries two clean labels: the Bayes-optimal prediction is defined by the text alone."""
    texts, _, clean = reviews.generate(3000, seed=11)
    seen: dict[str, int] = {}
    assert all(seen.setdefault(text, label) == label for text, label in zip(texts, clean, strict=True))


def test_the_ceiling_is_the_share_of_clean_labels_and_a_clean_label_predictor_scores_it_exactly():
    split = data.generate_reviews(1000, seed=5)
    labels, clean = list(split["label"]), list(split["clean_label"])
    ceiling = reviews.accuracy_ceiling(labels, clean)
    assert ceiling == sum(a == b for a, b in zip(labels, clean, strict=True)) / 1000
    assert ceiling < 1.0  # the noise changed some labels
    scored = classification_metrics(torch.tensor(clean), torch.tensor(labels), num_labels=3)
    assert scored["accuracy"] == pytest.approx(ceiling, abs=1e-6)  # float32 mean of 1,000 hits


def test_every_embedded_review_fits_the_default_sequence_length():
    """A cut review could lose the words that decide it, and the ceiling would no longer be exact."""
    from optbench.workloads.base import load_tokenizer

    train, held_out = data.embedded_splits()
    tokenizer = load_tokenizer(None)
    lengths = [len(ids) for ids in tokenizer(list(train["text"]) + list(held_out["text"]))["input_ids"]]
    assert max(lengths) <= 32


def test_the_workload_records_the_ceiling_only_where_no_eval_row_is_cut():
    from optbench.workloads.base import load_tokenizer

    tokenizer = load_tokenizer(None)
    held_out = data.generate_reviews(200, seed=3)
    ceiling, chance = eval_bounds(tokenizer, held_out, 32)
    labels = list(held_out["label"])
    assert ceiling == reviews.accuracy_ceiling(labels, list(held_out["clean_label"]))
    assert chance == max(labels.count(k) for k in range(3)) / 200
    assert eval_bounds(tokenizer, held_out, 8)[0] is None  # rows cut at 8 tokens: no exact ceiling
    assert eval_bounds(tokenizer, held_out.remove_columns("clean_label"), 32) == (None, chance)  # a user's data


def test_user_csv_with_string_labels_is_encoded_and_split(tmp_path):
    path = tmp_path / "reviews.csv"
    pd.DataFrame({"review": [f"text {i}" for i in range(40)],
                  "sentiment": ["good", "bad"] * 20}).to_csv(path, index=False)
    train, held_out = data.load_user_dataset(str(path), "review", "sentiment")
    assert len(train) == 36 and len(held_out) == 4
    assert train.features["sentiment"].names == ["bad", "good"]


@pytest.mark.parametrize("column, says", [("sentiment", "'sentiment' is empty in 2 of its 40 train rows (the first: "
                                                         "row 6)"),
                                          ("review", "'review' is empty in 2 of its 40 train rows (the first: row 6)")])
def test_empty_cells_are_refused_not_a_class_or_a_text_named_none(tmp_path, column, says):
    """Five empty label cells in fifty trained a fourth class, "None", and said nothing."""
    frame = pd.DataFrame({"review": [f"text {i}" for i in range(40)], "sentiment": ["good", "bad"] * 20})
    frame.loc[[5, 17], column] = None
    frame.to_csv(tmp_path / "reviews.csv", index=False)
    with pytest.raises(data.DatasetError, match=says.replace("(", r"\(").replace(")", r"\)")):
        data.load_user_dataset(str(tmp_path / "reviews.csv"), "review", "sentiment")


def test_a_class_label_of_minus_one_is_no_label(tmp_path):
    """A ClassLabel's -1 (an unlabelled test split's) is an empty cell too."""
    import datasets

    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    split = datasets.Dataset.from_dict({"text": ["a", "b", "c"], "label": [0, -1, 1]}, features=features)
    with pytest.raises(data.DatasetError, match="'label' is empty in 1 of its 3 held-out rows"):
        data._refuse_empty_cells("x", "held-out", split, "label")
    # a split without the column is left to the code that selects it (a KeyError here was a traceback)
    data._refuse_empty_cells("x", "held-out", split.remove_columns("label"), "label")


def test_missing_column_names_the_columns_there(tmp_path):
    path = tmp_path / "reviews.csv"
    pd.DataFrame({"review": ["a", "b"], "y": [0, 1]}).to_csv(path, index=False)
    with pytest.raises(data.DatasetError, match="no column 'label'.*columns: review, y"):
        data.load_user_dataset(str(path), "review", "label")


def test_hub_dataset_offline_names_the_offline_default():
    with pytest.raises(data.DatasetError, match="offline default is the embedded dataset"):
        data.load_user_dataset("some-user/some-dataset:config", "text", "label")
