"""Reading spec files: positions, duplicate keys, and what is not a spec."""

import pytest

from fusegen.spec import source
from fusegen.errors import SpecErrors


def test_values_and_keys_keep_their_positions(write_spec):
    path = write_spec("""
        kernels:
          - name: k
            dims: {M: dynamic}
        """)
    src = source.load(path)
    assert src.data == {"kernels": [{"name": "k", "dims": {"M": "dynamic"}}]}
    assert src.locate(("kernels", 0, "name")) == (2, 11)
    assert src.locate(("kernels", 0, "name"), key=True) == (2, 5)
    assert src.locate(("kernels", 0, "dims", "M")) == (3, 15)
    # A path that does not exist points at its nearest existing ancestor.
    assert src.locate(("kernels", 0, "chain", 3)) == src.locate(("kernels", 0))


def test_duplicate_keys_are_errors_not_overwrites(write_spec):
    path = write_spec("a: 1\nb: 2\na: 3\n")
    with pytest.raises(SpecErrors) as exc:
        source.load(path)
    (error,) = exc.value.errors
    assert (error.line, error.col) == (3, 1)
    assert "key 'a' appears twice" in error.message and "line 1" in error.message


def test_anchors_and_merge_keys_work(write_spec):
    path = write_spec("""
        base: &base {M: dynamic, N: 64}
        kernels:
          - dims: {<<: *base, K: 8}
        """)
    assert source.load(path).data["kernels"][0]["dims"] == {"M": "dynamic", "N": 64, "K": 8}


def test_merged_keys_are_overridden_as_in_yaml(write_spec):
    # Explicit keys win over merged ones; of `<<: [*a, *b]`, a's win over b's. Merged
    # keys come first, in PyYAML's order (dims and inputs keep their order).
    path = write_spec("""
        a: &a {M: 1, K: 1}
        b: &b {M: 2, N: 2}
        d: {<<: [*a, *b], N: 3, X: 0}
        """)
    src = source.load(path)
    assert src.data["d"] == {"M": 1, "N": 3, "K": 1, "X": 0}
    assert list(src.data["d"]) == ["M", "N", "K", "X"]
    assert src.locate(("d", "M")) == (1, 11)  # where the merged value stands


def test_aliases_point_at_their_use(write_spec):
    path = write_spec("""
        a: &a {M: 1}
        b: [*a, *a]
        """)
    src = source.load(path)
    assert src.data["b"] == [{"M": 1}, {"M": 1}]
    assert src.locate(("b", 1)) == (2, 9)
    assert src.locate(("b", 1, "M")) == (1, 11)


def test_dates_stay_text(write_spec):
    # YAML 1.1 reads 2024-01-01 as a date; no field takes one.
    assert source.load(write_spec("doc: 2024-01-01\n")).data == {"doc": "2024-01-01"}


def test_exponents_without_a_dot_are_floats(write_spec):
    # YAML 1.1 reads 1e-4 as text (it wants 1.0e-4); YAML 1.2, and users, read a number.
    data = source.load(write_spec("a: 1e-4\nb: -2E+3\nc: 1.5e3\nd: 1e\ne: '1e-4'\n")).data
    assert data == {"a": 1e-4, "b": -2e3, "c": 1.5e3, "d": "1e", "e": "1e-4"}


def test_yaml_booleans_as_keys_stay_names(write_spec):
    # YAML 1.1 reads a bare `on` as True; as a key here it must stay the name "on".
    assert source.load(write_spec("on: 1\n")).data == {"on": 1}


def test_only_true_and_false_are_booleans(write_spec):
    # YAML 1.2 and the JSON Schema: `nonfinite: off` (docs/spec.md's example) is the word.
    text = "a: off\nb: yes\nc: On\nd: true\ne: FALSE\nf: 'true'\n"
    data = source.load(write_spec(text)).data
    assert data == {"a": "off", "b": "yes", "c": "On", "d": True, "e": False, "f": "true"}


def test_a_flag_given_yes_says_what_a_flag_takes(write_spec, run_cli):
    spec = write_spec(
        "kernels:\n  - name: k\n    dims: {M: dynamic, N: 96}\n    inputs: {x: [M, N]}\n"
        "    chain: [{input: x}, relu]\n    deterministic: yes\n"
        "    fallback: {no_gpu: reference, nonfinite: off}\n"
    )
    code, _, err = run_cli("validate", str(spec))
    assert code == 2 and "6:20: kernels[0].deterministic: a flag, got 'yes'" in err
    assert "true or false" in err and "nonfinite" not in err


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "the file is empty"),
        ("# only a comment\n", "the file is empty"),
        ("- 1\n- 2\n", "holds a list, not a mapping"),
        ("just text\n", "holds a str, not a mapping"),
        ("a: [1, 2\n", "not valid YAML"),
        ("a:\n\t- 1\n", "not valid YAML"),
        ("a: 1\n---\nb: 2\n", "expected a single document"),
    ],
)
def test_not_a_spec(write_spec, text, message):
    with pytest.raises(SpecErrors) as exc:
        source.load(write_spec(text))
    assert message in exc.value.errors[0].message


def test_unreadable_file(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpecErrors, match="cannot read"):
        source.load(path)


def test_hash_ignores_line_endings(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_bytes(b"kernels: []\n")
    b.write_bytes(b"kernels: []\r\n")
    assert source.load(a).sha256 == source.load(b).sha256


def test_display_name_is_relative_to_the_repo(tmp_path, monkeypatch):
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    spec = tmp_path / "repo" / "specs" / "a.yaml"
    spec.parent.mkdir()
    spec.write_text("kernels: []\n")
    monkeypatch.chdir(tmp_path)
    assert source.display_name(spec) == "specs/a.yaml"
