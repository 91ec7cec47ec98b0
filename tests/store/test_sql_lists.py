from store.indexing.sql_lists import IN_LIST_CHUNK, in_chunks


def test_in_chunks_covers_every_value_once_with_one_mark_each() -> None:
    values = list(range(2 * IN_LIST_CHUNK + 3))
    got = list(in_chunks(values))
    assert [len(chunk) for _, chunk in got] == [IN_LIST_CHUNK, IN_LIST_CHUNK, 3]
    assert [v for _, chunk in got for v in chunk] == values
    assert all(marks == ",".join("?" * len(chunk)) for marks, chunk in got)


def test_in_chunks_of_nothing_yields_nothing() -> None:
    assert list(in_chunks([])) == []
