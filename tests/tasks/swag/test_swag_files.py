"""The SWAG CSV reader (bertkit.tasks.swag.files) on hand-written files: columns found by header
name, quoted fields with commas, quotes and line breaks, each error message with its file,
line and column; the Hub path with a stand-in dataset and without network."""

from __future__ import annotations

import datasets
import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.swag import files as swag_files
from bertkit.tasks.swag.data import load_swag_splits
from bertkit.tasks.swag.files import read_swag_csv, swag_from_hub
from tests.conftest import compose_config

RELEASE = (
    ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,"
    "label\n"
    "0,anetv_a,3416,The man sits. He,The man sits.,He,gold,stands up.,eats,runs,swims,0\n"
    '1,lsmdc_b,42,"A dog, wet, runs. It","A dog, wet, runs.",It,gen,"barks, loudly.",'
    '"says ""hi"".",sleeps,"jumps\nover a log.",3\n'
    "2,anetv_c,7,Someone waves. She,Someone waves.,She,gold,waves back.,leaves,sings,cries,2\n"
)


def write(tmp_path, text: str, name: str = "val.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_release_layout_is_read_by_header_name_with_quoted_fields(tmp_path):
    table = read_swag_csv(write(tmp_path, RELEASE))
    assert table.features == swag_files.FEATURES
    assert table["idx"] == [0, 1, 2]
    assert table["video_id"] == ["anetv_a", "lsmdc_b", "anetv_c"]
    assert table["fold_ind"] == ["3416", "42", "7"]
    assert table["sent1"] == ["The man sits.", "A dog, wet, runs.", "Someone waves."]
    assert table["sent2"] == ["He", "It", "She"]
    assert table[1]["ending0"] == "barks, loudly."
    assert table[1]["ending1"] == 'says "hi".'
    assert table[1]["ending3"] == "jumps\nover a log."  # a line break inside a quoted field
    assert table["label"] == [0, 3, 2]


def test_column_order_and_the_index_column_do_not_matter(tmp_path):
    """The Hub's order without the unnamed index column, and extra columns anywhere."""
    reordered = [
        "label,ending3,ending2,ending1,ending0,extra,sent2,sent1,fold-ind,video-id",
        "0,swims,runs,eats,stands up.,x,He,The man sits.,3416,anetv_a",
        '3,"jumps\nover a log.",sleeps,"says ""hi"".","barks, loudly.",y,It,"A dog, wet, '
        'runs.",42,lsmdc_b',
        "2,cries,sings,leaves,waves back.,z,She,Someone waves.,7,anetv_c",
    ]
    table = read_swag_csv(write(tmp_path, "\n".join(reordered) + "\n"))
    assert table.to_list() == read_swag_csv(write(tmp_path, RELEASE, "release.csv")).to_list()


def test_identifier_columns_are_optional(tmp_path):
    text = "sent1,sent2,ending0,ending1,ending2,ending3,label\nA.,B,c,d,e,f,1\n"
    table = read_swag_csv(write(tmp_path, text))
    assert (table["video_id"], table["fold_ind"], table["label"]) == ([""], [""], [1])


def test_crlf_line_ends_and_a_bom_are_read(tmp_path):
    path = tmp_path / "val.csv"
    path.write_bytes(b"\xef\xbb\xbf" + RELEASE.replace("\n", "\r\n").encode())
    table = read_swag_csv(path)
    assert table["label"] == [0, 3, 2]
    assert table[1]["ending3"] == "jumps\r\nover a log."  # inside quotes: kept as written
    assert table["video_id"][0] == "anetv_a"


HEAD = RELEASE.split("\n")[0] + "\n"
ROW = "9,anetv_z,1,A b. C,A b.,C,gold,d,e,f,g,{label}\n"


@pytest.mark.parametrize(("text", "message"), [
    # The quoted row spans lines 3-4, the next row is line 5: the bad row is on line 6.
    (RELEASE + "3,anetv_d,8,x,x,y,gold,a,b,c,1\n",
     r"val.csv, line 6: 11 comma-separated fields, expected 12 \(as in the header\)"),
    (RELEASE + "3,anetv_d,8,x,x,y,gold,a,b,c,d,1,extra\n",
     r"val.csv, line 6: 13 comma-separated fields, expected 12"),
    (HEAD.replace(",ending2", ",ending_2") + ROW.format(label=0),
     r"val.csv, line 1: no column 'ending2' in the header; expected the SWAG columns .*"
     r"the header has: , video-id, fold-ind, .*ending_2"),
    (HEAD.replace(",label", ",gold") + ROW.format(label=0),
     r"val.csv, line 1: no column 'label' in the header"),
    (HEAD + ROW.format(label=0) + ROW.format(label=4),
     r"val.csv, line 3, column 'label': 4 is outside 0 to 3"),
    (HEAD + ROW.format(label=-1),
     r"val.csv, line 2, column 'label': -1 is outside 0 to 3"),
    (HEAD + ROW.format(label="1.0"),
     r"val.csv, line 2, column 'label': '1.0' is not an integer"),
    (HEAD + ROW.format(label=""),
     r"val.csv, line 2, column 'label': '' is not an integer"),
    (RELEASE + "3,anetv_d,8,x,x,y,gold,a, ,c,d,1\n",
     r"val.csv, line 6, column 'ending1': empty ending"),
    (HEAD + "3,anetv_d,8,x,x,y,gold,a,b,c,,1\n",
     r"val.csv, line 2, column 'ending3': empty ending"),
    (HEAD.replace(",sent1", ",label"), r"val.csv, line 1: column 'label' appears twice"),
    ("", r"val.csv: the file is empty \(expected a header line with sent1, sent2, ending0"),
    (HEAD, r"val.csv: no examples"),
])
def test_bad_input_names_the_file_line_and_column(tmp_path, text, message):
    with pytest.raises(BertkitError, match=message):
        read_swag_csv(write(tmp_path, text))


def test_not_utf8_and_missing_file(tmp_path):
    path = tmp_path / "val.csv"
    path.write_bytes(HEAD.encode() + ROW.format(label=0).encode() + b"9,\xff,1,a,b,c,d,e,f,g,h,0\n")
    with pytest.raises(BertkitError, match=r"val.csv, line 3: not valid UTF-8"):
        read_swag_csv(path)
    with pytest.raises(BertkitError, match=r"absent.csv: file not found"):
        read_swag_csv(tmp_path / "absent.csv")


def hub_split(labels: list[int]) -> datasets.Dataset:
    """The Hub's swag/regular schema, label a ClassLabel."""
    n = len(labels)
    features = datasets.Features({
        **{name: datasets.Value("string") for name in (
            "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
            "ending0", "ending1", "ending2", "ending3")},
        "label": datasets.ClassLabel(names=["0", "1", "2", "3"]) if min(labels) >= 0
        else datasets.Value("int64"),
    })
    return datasets.Dataset.from_dict({
        "video-id": [f"v{i}" for i in range(n)], "fold-ind": [str(10 + i) for i in range(n)],
        "startphrase": ["s"] * n, "sent1": [f"first {i}." for i in range(n)],
        "sent2": ["He"] * n, "gold-source": ["gold"] * n,
        **{f"ending{k}": [f"end{k}"] * n for k in range(4)}, "label": labels,
    }, features=features)


FILES = {"train": "train.csv", "validation": "val.csv"}


def test_hub_split_becomes_the_schema(monkeypatch):
    calls = []
    monkeypatch.setattr(swag_files.datasets, "load_dataset",
                        lambda *args, **kwargs: calls.append((args, kwargs)) or
                        hub_split([3, 0, 2]))
    table = swag_from_hub("allenai/swag", "regular", "validation", FILES)
    assert calls == [(("allenai/swag", "regular"), {"split": "validation"})]
    assert table.features == swag_files.FEATURES
    assert table["idx"] == [0, 1, 2] and table["label"] == [3, 0, 2]
    assert table["fold_ind"] == ["10", "11", "12"] and table["video_id"] == ["v0", "v1", "v2"]
    assert table["sent1"][2] == "first 2." and table["ending3"] == ["end3"] * 3


def test_hub_splits_follow_the_task_config(monkeypatch):
    calls = []

    def load(path, name, split):
        calls.append((path, name, split))
        return hub_split([1, 2] if split == "train" else [0])

    monkeypatch.setattr(swag_files.datasets, "load_dataset", load)
    splits = load_swag_splits(compose_config(["recipe=swag"]).task)
    assert calls == [("allenai/swag", "regular", "train"),
                     ("allenai/swag", "regular", "validation")]
    assert splits["train"]["label"] == [1, 2] and splits["validation"]["label"] == [0]
    assert {split: len(fingerprint) for split, fingerprint in splits.fingerprints.items()} \
        == {"train": 16, "validation": 16}


def test_unlabelled_hub_split_is_refused(monkeypatch):
    monkeypatch.setattr(swag_files.datasets, "load_dataset", lambda *a, **k: hub_split([1, -1]))
    with pytest.raises(BertkitError, match=r"allenai/swag/regular \(test\), row 1: label -1"):
        swag_from_hub("allenai/swag", "regular", "test", FILES)


def test_unreachable_hub_points_to_the_csv_files(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'allenai/swag' on the Hub (LocalEntryNotFound)")

    monkeypatch.setattr(swag_files.datasets, "load_dataset", offline)
    with pytest.raises(BertkitError) as caught:
        load_swag_splits(compose_config(["recipe=swag"]).task)
    message = str(caught.value)
    assert message.startswith("could not load split 'train' of the Hub dataset "
                              "allenai/swag/regular (ConnectionError: Couldn't reach")
    assert "task.data_dir=<dir with train.csv and val.csv>" in message
    assert "task.train_file=<path to train.csv> task.validation_file=<path to val.csv>" in message


def test_hub_offline_environment_gives_the_same_message(hub_offline):
    with pytest.raises(BertkitError, match=r"allenai/swag/regular \(ConnectionError: .*"
                                           r"OfflineModeIsEnabled.*task.train_file=<path to "
                                           r"train.csv>"):
        load_swag_splits(compose_config(["recipe=swag"]).task)


def test_local_files_need_both_splits(tmp_path):
    write(tmp_path, RELEASE, "train.csv")
    task = compose_config(["recipe=swag", f"task.data_dir={tmp_path}"]).task
    with pytest.raises(BertkitError, match=r"task.data_dir: .*val.csv not found \(the "
                                           r"validation split of swag"):
        load_swag_splits(task)
    single = compose_config(["recipe=swag", f"task.data_dir={tmp_path}",
                             f"task.validation_file={tmp_path / 'train.csv'}"]).task
    splits = load_swag_splits(single)
    assert splits["validation"].to_list() == splits["train"].to_list()


def test_fingerprint_follows_the_content_not_the_path(tmp_path):
    def fingerprint(directory, text):
        write(directory, text, "train.csv")
        write(directory, RELEASE, "val.csv")
        return load_swag_splits(compose_config(
            ["recipe=swag", f"task.data_dir={directory}"]).task).fingerprint()

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    first = fingerprint(tmp_path / "a", RELEASE)
    assert fingerprint(tmp_path / "b", RELEASE) == first
    assert fingerprint(tmp_path / "c", RELEASE.replace("waves back.", "waves.")) != first
