"""The embedded task and user datasets, all offline."""

import pandas as pd
import pytest

from optbench.workloads import data


def test_embedded_task_is_seeded_balanced_and_compositional():
    a, b = data.generate_reviews(600, seed=7), data.generate_reviews(600, seed=7)
    assert a["text"] == b["text"] and a["label"] == b["label"]
    counts = pd.Series(a["label"]).value_counts()
    assert set(counts.index) == {0, 1, 2} and counts.min() > 150
    texts = " ".join(a["text"])
    for marker in (" but ", "although ", "even though ", " not ", "could have been"):
        assert marker in texts


def test_user_csv_with_string_labels_is_encoded_and_split(tmp_path):
    path = tmp_path / "reviews.csv"
    pd.DataFrame({"review": [f"text {i}" for i in range(40)],
                  "sentiment": ["good", "bad"] * 20}).to_csv(path, index=False)
    train, held_out = data.load_user_dataset(str(path), "review", "sentiment")
    assert len(train) == 36 and len(held_out) == 4
    assert train.features["sentiment"].names == ["bad", "good"]


def test_missing_column_names_the_columns_there(tmp_path):
    path = tmp_path / "reviews.csv"
    pd.DataFrame({"review": ["a", "b"], "y": [0, 1]}).to_csv(path, index=False)
    with pytest.raises(data.DatasetError, match="no column 'label'.*columns: review, y"):
        data.load_user_dataset(str(path), "review", "label")


def test_hub_dataset_offline_names_the_offline_default():
    with pytest.raises(data.DatasetError, match="offline default is the embedded dataset"):
        data.load_user_dataset("some-user/some-dataset:config", "text", "label")
