"""GLUE tables compared byte for byte with tables whose numbers were worked out by hand."""

from bertkit.reporting.tables import column_header, glue_table_csv, glue_table_markdown

ROWS = {
    # cola 52, 56 -> 54.0 ± sqrt(8) (54.0); mrpc 88.1 88.9 89.3 -> 88.77 ± 0.611 (88.9);
    # rte 66 70 68 -> 68.0 ± 2.0 (68.0); average (54 + 88.767 + 68) / 3 = 70.26
    "BERT-base (paper grid)": {"mrpc": [0.881, 0.889, 0.893], "rte": [0.66, 0.7, 0.68],
                               "cola": [0.52, 0.56]},
    # one seed: the mean alone; average (50 + 85 + 70) / 3 = 68.33
    "BERT-base, 1 seed": {"mrpc": [0.85], "rte": [0.7], "cola": [0.5]},
    # no CoLA: "-" and no average; mrpc 84 86 -> 85.0 ± sqrt(2); rte 60 64 -> 62.0 ± sqrt(8)
    "no NSP": {"mrpc": [0.84, 0.86], "rte": [0.6, 0.64]},
}
TASKS = ["cola", "mrpc", "rte"]
METRICS = {"cola": "matthews_correlation", "mrpc": "f1", "rte": "accuracy"}


def test_markdown_table_is_exact():
    expected = (
        "| System                 |        CoLA (MCC) |         MRPC (F1) |"
        "         RTE (Acc) | Average |\n"
        "| ---------------------- | ----------------: | ----------------: |"
        " ----------------: | ------: |\n"
        "| BERT-base (paper grid) | 54.0 ± 2.8 (54.0) | 88.8 ± 0.6 (88.9) |"
        " 68.0 ± 2.0 (68.0) |    70.3 |\n"
        "| BERT-base, 1 seed      |              50.0 |              85.0 |"
        "              70.0 |    68.3 |\n"
        "| no NSP                 |                 - | 85.0 ± 1.4 (85.0) |"
        " 62.0 ± 2.8 (62.0) |       - |\n"
    )
    assert glue_table_markdown(ROWS, TASKS, METRICS) == expected


def test_markdown_decimals_scale_and_column_order():
    table = glue_table_markdown({"x": {"rte": [0.5, 0.7], "mrpc": [0.9, 0.9]}},
                                ["rte", "mrpc"], decimals=3, scale=1.0, system_header="Model")
    assert table == (
        "| Model |                   RTE |                  MRPC | Average |\n"
        "| ----- | --------------------: | --------------------: | ------: |\n"
        "| x     | 0.600 ± 0.141 (0.600) | 0.900 ± 0.000 (0.900) |   0.750 |\n"
    )


def test_column_header_names():
    assert column_header("sst2", "accuracy") == "SST-2 (Acc)"
    assert column_header("stsb", "spearman") == "STS-B (Spearman)"
    assert column_header("mytask", "bleu") == "mytask (bleu)"
    assert column_header("qqp") == "QQP"


def test_csv_table_is_exact():
    assert glue_table_csv(ROWS, TASKS, decimals=2) == (
        "system,cola_mean,cola_std,cola_median,cola_n,mrpc_mean,mrpc_std,mrpc_median,mrpc_n,"
        "rte_mean,rte_std,rte_median,rte_n,average\n"
        "BERT-base (paper grid),54.00,2.83,54.00,2,88.77,0.61,88.90,3,68.00,2.00,68.00,3,70.26\n"
        '"BERT-base, 1 seed",50.00,,50.00,1,85.00,,85.00,1,70.00,,70.00,1,68.33\n'
        "no NSP,,,,,85.00,1.41,85.00,2,62.00,2.83,62.00,2,\n"
    )
    full = glue_table_csv({"x": {"rte": [0.5, 0.75]}}, ["rte"], scale=1.0)
    assert full.splitlines()[1] == "x,0.625,0.1767766952966369,0.625,2,0.625"
