"""The public surface is small and pinned (STYLE §2)."""

import constrain

EXPECTED = {
    "ConstrainError", "InternalError", "InvalidSchema", "MaskProcessor", "MaskViolation", "Policy", "RequestError",
    "TokenIndex", "TokenState", "TokenizerError", "UnsupportedSchema", "Vocabulary", "apply_token_mask",
    "compile_index", "compile_json_schema", "compile_regex", "parse_output",
}


def test_all_is_pinned():
    assert set(constrain.__all__) == EXPECTED


def test_every_exported_name_resolves():
    for name in constrain.__all__:
        assert getattr(constrain, name) is not None, name


def test_issue_api_on_a_real_vocabulary(llama3_vocab):
    index = constrain.compile_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, llama3_vocab)
    state = index.start()
    ids = state.allowed_token_ids()
    assert list(ids) == sorted(ids) and len(ids) > 0
    assert state.mask().dtype.name == "int32"
    assert not state.is_accepting()
    regex = constrain.compile_regex(r"[0-9]{3}-[a-z]+", llama3_vocab)
    assert len(regex.start().allowed_token_ids()) > 0
