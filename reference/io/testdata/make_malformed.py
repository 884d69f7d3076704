#!/usr/bin/env python3
"""Writes the safetensors reader's test corpus (format: huggingface/safetensors README and
safetensors/src/tensor.rs): malformed/*.safetensors, one defect each, with malformed/README.md
(file -> defect -> message fragment, read by safetensors_test.cc and
inspect_malformed_test.cmake), and valid/*.safetensors, edge cases the reader must accept.

Run from anywhere: python3 reference/io/testdata/make_malformed.py (standard library only;
the output is deterministic, so re-running it leaves the committed files unchanged).
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_HEADER = 100_000_000  # tensor.rs MAX_HEADER_SIZE


def prefix(n):
    return struct.pack("<Q", n)


def st(header, data=b"", n=None):
    """A file: length prefix (len(header) unless n is given), header bytes, data bytes."""
    if isinstance(header, str):
        header = header.encode("utf-8")
    return prefix(len(header) if n is None else n) + header + data


def entry(dtype, shape, offsets):
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def js(obj):
    return json.dumps(obj, separators=(",", ":"))


def f32(*values):
    return struct.pack("<%df" % len(values), *values)


# (file name, defect, expected message fragment, file bytes). The fragment must appear in the
# reader's error message (after the file name); it must not contain '|' or ';'.
MALFORMED = []


def case(name, defect, fragment, data):
    MALFORMED.append((name + ".safetensors", defect, fragment, data))


case("empty", "empty file", "file is 0 bytes, shorter than the 8-byte header length prefix", b"")
case("too_short", "file shorter than the 8-byte length prefix",
     "file is 5 bytes, shorter than the 8-byte header length prefix", b"\x10\x00\x00\x00\x00")
case("header_past_eof", "header length past the end of the file",
     "header length 64 runs past the end of the file (24 bytes)", st("{}      ", n=64) + b"\0" * 8)
case("header_too_large", "header length over the 100 MB cap",
     "header length 100000001 exceeds the 100000000-byte limit", st("{}      ", n=MAX_HEADER + 1))
case("header_length_max", "header length 2^64-1 (would overflow N + 8)",
     "header length 18446744073709551615 exceeds the 100000000-byte limit",
     st("{}      ", n=2**64 - 1))
case("empty_header", "header length 0: no JSON at all", "invalid JSON in header", st(""))
case("invalid_json", "truncated JSON", "invalid JSON in header",
     st('{"a":{"dtype":"F32","shape":[1],'))
case("trailing_json", "JSON followed by a non-space token", "invalid JSON in header",
     st("{} x    "))
case("json_comment", "JSON with a comment (not JSON)", "invalid JSON in header",
     st("{/* c */}"))
case("bom", "header starts with a UTF-8 byte-order mark",
     "invalid JSON in header: starts with a byte-order mark", st(b"\xef\xbb\xbf{}   "))
case("invalid_utf8", "invalid UTF-8 (C3 followed by ASCII) in a key",
     "invalid UTF-8 in header at byte 11", st(b'{"a\xc3(":1}'))
case("overlong_utf8", "overlong UTF-8 encoding of '/' (C0 AF)",
     "invalid UTF-8 in header at byte 11", st(b'{"a\xc0\xaf":1}'))
case("surrogate_utf8", "UTF-8-encoded surrogate U+D800 (ED A0 80)",
     "invalid UTF-8 in header at byte 11", st(b'{"a\xed\xa0\x80":1}'))
case("truncated_utf8", "header ends inside a multi-byte UTF-8 sequence",
     "invalid UTF-8 in header at byte 16", st(b'{"ab":1}\xe2\x82'))
case("header_not_object", "header is a JSON array", "header is not a JSON object",
     st("[1,2]   "))
case("header_string", "header is a JSON string", "header is not a JSON object", st('"{}"'))
case("entry_not_object", "tensor entry is a number",
     'tensor "a": entry is not a JSON object', st('{"a":3}'))
case("missing_field", "entry without data_offsets",
     'tensor "a": missing field "data_offsets"', st(js({"a": {"dtype": "F32", "shape": [1]}})))
case("extra_field", "entry with an unknown field",
     'tensor "a": unexpected field "strides"',
     st(js({"a": {**entry("F32", [1], [0, 4]), "strides": [1]}}), f32(1)))
case("unknown_dtype", "dtype no implementation knows", 'tensor "a": unknown dtype "F128"',
     st(js({"a": entry("F128", [1], [0, 16])}), b"\0" * 16))
case("unsupported_dtype", "safetensors dtype that attest does not hold (I16)",
     'tensor "a": safetensors dtype "I16" is not supported by attest',
     st(js({"a": entry("I16", [1], [0, 2])}), b"\0" * 2))
case("dtype_lowercase", "dtype spelled in lower case", 'tensor "a": unknown dtype "f32"',
     st(js({"a": entry("f32", [1], [0, 4])}), f32(1)))
case("dtype_not_string", "dtype is a number", 'tensor "a": dtype is not a string',
     st(js({"a": entry(4, [1], [0, 4])}), f32(1)))
case("shape_negative", "negative dimension",
     'tensor "a": shape is not a list of non-negative integers',
     st(js({"a": entry("F32", [-1, 2], [0, 8])}), f32(1, 2)))
case("shape_float", "dimension written as a float (2.0)",
     'tensor "a": shape is not a list of non-negative integers',
     st('{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', f32(1, 2)))
case("shape_not_list", "shape is a number",
     'tensor "a": shape is not a list of non-negative integers',
     st(js({"a": entry("F32", 2, [0, 8])}), f32(1, 2)))
case("shape_huge_dim", "dimension beyond 2^64 (parsed as a float)",
     'tensor "a": shape is not a list of non-negative integers',
     st('{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,0]}}'))
case("number_out_of_range", "float literal beyond double's range (1e400)",
     "invalid JSON in header: number out of range",
     st('{"a":{"dtype":"U8","shape":[1e400],"data_offsets":[0,0]}}'))
case("numel_overflow", "element count 2^64 overflows",
     'tensor "a": element count of shape [4294967296,4294967296] overflows 64 bits',
     st(js({"a": entry("U8", [2**32, 2**32], [0, 0])})))
case("bytes_overflow", "element count fits but the byte count (2^61 x 8) overflows",
     'tensor "a": element count of shape [2305843009213693952] overflows 64 bits',
     st(js({"a": entry("F64", [2**61], [0, 0])})))
case("offsets_not_two", "data_offsets with one integer",
     'tensor "a": data_offsets is not a list of two non-negative integers',
     st(js({"a": entry("F32", [1], [0])}), f32(1)))
case("offsets_negative", "negative begin offset",
     'tensor "a": data_offsets is not a list of two non-negative integers',
     st(js({"a": entry("F32", [1], [-4, 0])}), f32(1)))
case("offsets_reversed", "begin > end", 'tensor "a": data_offsets [8, 0] have begin > end',
     st(js({"a": entry("F32", [2], [8, 0])}), f32(1, 2)))
case("byte_count_mismatch", "extent differs from numel x dtype size",
     'tensor "a": data_offsets [0, 4] span 4 bytes but f32[2] needs 8',
     st(js({"a": entry("F32", [2], [0, 4])}), f32(1)))
case("offsets_past_end", "extent runs past the end of the data buffer",
     'tensor "a": data_offsets [0, 16] run past the end of the 8-byte data buffer',
     st(js({"a": entry("F32", [4], [0, 16])}), f32(1, 2)))
case("overlap", "two tensors share bytes",
     'tensor "b": data_offsets [4, 12] overlap tensor "a" [0, 8]',
     st(js({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [2], [4, 12])}), f32(1, 2, 3)))
case("same_extent", "two tensors with identical extents",
     'tensor "b": data_offsets [0, 8] overlap tensor "a" [0, 8]',
     st(js({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [2], [0, 8])}), f32(1, 2)))
case("hole", "gap between two tensors",
     'tensor "b": data_offsets [12, 20] leave a hole of 4 bytes after tensor "a" ending at 8',
     st(js({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [2], [12, 20])}),
        f32(1, 2, 0, 3, 4)))
case("hole_at_start", "first tensor does not start at offset 0",
     'tensor "a": data_offsets [4, 12] leave a hole of 4 bytes at the start of the data buffer',
     st(js({"a": entry("F32", [2], [4, 12])}), f32(0, 1, 2)))
case("trailing_bytes", "data buffer longer than the tensors (bytes after the last one)",
     "data buffer has 12 bytes but the tensors cover only 8",
     st(js({"a": entry("F32", [2], [0, 8])}), f32(1, 2, 3)))
case("data_without_tensors", "empty header followed by data bytes",
     "data buffer has 4 bytes but the tensors cover only 0", st("{}", f32(1)))
case("duplicate_name", "the same tensor name twice (a JSON DOM keeps one silently)",
     'duplicate key "a" in header',
     st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32(1, 2)))
case("duplicate_field", "the same field twice in one entry",
     'duplicate key "dtype" inside "a"',
     st('{"a":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}}', f32(1)))
case("duplicate_metadata_key", "the same metadata key twice",
     'duplicate key "k" inside "__metadata__"',
     st('{"__metadata__":{"k":"x","k":"y"}}'))
case("metadata_not_object", "__metadata__ is a list",
     "__metadata__ is not a JSON object of strings", st(js({"__metadata__": ["x"]})))
case("metadata_null", "__metadata__ is null (tensor.rs reads it as absent; we refuse)",
     "__metadata__ is not a JSON object of strings", st(js({"__metadata__": None})))
case("metadata_value_not_string", "__metadata__ value is a number",
     '__metadata__ value for key "k" is not a string', st(js({"__metadata__": {"k": 1}})))
case("deep_nesting", "10000 nested lists in a tensor entry (parser stack bomb)",
     'header nests containers deeper than a safetensors header can (under key "a")',
     st('{"a":' + "[" * 10000 + "]" * 10000 + "}"))

# Edge cases the reader must accept (checked value by value in safetensors_test.cc).
VALID = {
    # JSON order differs from data order: tensor.rs sorts entries by offsets.
    "unordered_keys.safetensors":
        st(js({"b": entry("F32", [1], [4, 8]), "a": entry("F32", [1], [0, 4])}), f32(1, 2)),
    # Empty tensors, one of them sharing its offset with the next tensor's start.
    "empty_tensors.safetensors":
        st(js({"z": entry("F32", [0, 3], [0, 0]), "a": entry("U8", [2], [0, 2]),
               "e": entry("I64", [], [2, 10])}), b"\x07\x09" + struct.pack("<q", -5)),
    # Metadata only, no tensors; header not padded (tensor.rs does not require padding).
    "metadata_only.safetensors": st(js({"__metadata__": {"format": "np", "x": ""}})),
    # Non-ASCII and escaped names; header padded with spaces, as the reference writer does.
    "unicode_names.safetensors":
        st('{"q\\u00e9":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},'
           '"\u03bb\\n":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[2,4]}}   ',
           b"\x80\x3f\x38\xb8"),
}


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def main():
    mdir = os.path.join(HERE, "malformed")
    vdir = os.path.join(HERE, "valid")
    os.makedirs(mdir, exist_ok=True)
    os.makedirs(vdir, exist_ok=True)
    names = [m[0] for m in MALFORMED]
    assert len(names) == len(set(names)), "duplicate file names"
    rows = []
    for name, defect, fragment, data in MALFORMED:
        assert "|" not in fragment and ";" not in fragment and "`" not in fragment, name
        write(os.path.join(mdir, name), data)
        rows.append(f"| `{name}` | {defect} | `{fragment}` |")
    for name, data in VALID.items():
        write(os.path.join(vdir, name), data)
    with open(os.path.join(mdir, "README.md"), "w") as f:
        f.write(
            "# Malformed safetensors files\n\n"
            "Written by `../make_malformed.py` (do not edit by hand: edit the script and\n"
            "re-run it). Each file has one defect; the reader's error message (which starts\n"
            "with the file's path) must contain the fragment, and `attest inspect FILE` must\n"
            "exit with code 2 and print it on stderr. Checked by `safetensors_test`\n"
            "(`MalformedCorpus`) and the ctest `safetensors_inspect_malformed`.\n\n"
            "The reference implementation (huggingface/safetensors 0.8.0, `tensor.rs`)\n"
            "rejects every file here except four, where attest is deliberately stricter:\n"
            "`extra_field` (an unknown field may change what the data means),\n"
            "`metadata_null` (tensor.rs reads it as absent), `duplicate_metadata_key`\n"
            "(a JSON map silently keeps one value) and `unsupported_dtype` (attest holds no\n"
            "I16). The ctest `safetensors_interop` pins this list. Edge cases the reader must\n"
            "accept are in `../valid/`.\n\n"
            "| file | defect | message fragment |\n"
            "|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
