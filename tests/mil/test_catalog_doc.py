"""docs/constraints.md is the constraint catalog of csrc/mil/catalog.c, read through
the C ABI (orion_constraint_count / orion_constraint_at). Any drift between the two
fails here: a row added, removed, reworded or reordered on one side only."""

import re
from pathlib import Path

import pytest

from orion.runtime._native import ffi, lib

pytestmark = pytest.mark.native

DOC = Path(__file__).resolve().parents[2] / "docs" / "constraints.md"
CHECKED = re.compile(r"^(compile|eval|load|not checked: .+)$")


def catalog_rows() -> list[tuple[str, str, str, str]]:
    rows = []
    c = ffi.new("orion_constraint *")
    for i in range(lib.orion_constraint_count()):
        assert lib.orion_constraint_at(i, c) == lib.ORION_OK
        rows.append(tuple(ffi.string(p).decode() for p in (c.id, c.title, c.fix, c.checked)))
    return rows


def doc_rows() -> list[tuple[str, ...]]:
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("| ANE-C"):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            assert len(cells) == 4, f"a table row needs 4 cells: {line}"
            rows.append(tuple(cells))
    return rows


def test_doc_table_equals_the_c_catalog():
    c_rows, d_rows = catalog_rows(), doc_rows()
    c_ids, d_ids = [r[0] for r in c_rows], [r[0] for r in d_rows]
    assert d_ids == c_ids, (
        f"only in C: {sorted(set(c_ids) - set(d_ids))}; "
        f"only in the doc: {sorted(set(d_ids) - set(c_ids))}"
    )
    for c_row, d_row in zip(c_rows, d_rows, strict=True):
        assert d_row == c_row, f"{c_row[0]} differs:\n  C:   {c_row}\n  doc: {d_row}"


def test_every_fact_constraint_has_one_row_in_order():
    # ane-facts §5 numbers the constraints C1..C49, compressed weights add C50..C57;
    # ids are two-digit
    assert [r[0] for r in catalog_rows()] == [f"ANE-C{n:02d}" for n in range(1, 58)]


def test_rows_are_complete():
    for cid, title, fix, checked in catalog_rows():
        assert title and fix, cid
        assert "|" not in title + fix + checked, f"{cid}: '|' would break the table"
        assert CHECKED.match(checked), f"{cid}: checked = {checked!r}"


def test_runtime_enforced_ids_are_where_the_runtime_checks_them():
    # the runtime enforces these ids (surfaces at eval, residency at load, the budget)
    where = {r[0]: r[3] for r in catalog_rows()}
    assert where["ANE-C17"] == "eval"
    assert where["ANE-C18"] == "eval"
    assert where["ANE-C25"] == "eval"
    assert where["ANE-C31"] == "compile"
    assert where["ANE-C34"] == "load"
    assert where["ANE-C35"] == "load"


def test_index_past_the_end_is_refused():
    c = ffi.new("orion_constraint *")
    past_the_end = lib.orion_constraint_count()
    assert lib.orion_constraint_at(past_the_end, c) == lib.ORION_ERR_INVALID_ARGUMENT
    assert lib.orion_constraint_at(0, ffi.NULL) == lib.ORION_ERR_INVALID_ARGUMENT
