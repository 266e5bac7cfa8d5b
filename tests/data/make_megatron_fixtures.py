#!/usr/bin/env python3
"""Writes small Megatron-LM indexed datasets (MMapIndexedDataset: PREFIX.bin +
PREFIX.idx) for tests/data/test_megatron.c, with a writer restated from
Megatron-LM's indexed_dataset.py (_IndexWriter / IndexedDatasetBuilder) in
numpy, independent of dsc:

  .idx: b"MMIDIDX\\x00\\x00", <Q version 1, <B dtype code, <Q sequence count,
        <Q document count, int32 sizes, int64 byte pointers, int64 doc_idx
  .bin: the sequences' tokens back to back in the dtype

The corpus is the first bytes of data/tinyshakespeare.txt as byte tokens:
one document per paragraph (split after each blank line), one sequence per
line, so the concatenated sequences are exactly those bytes, which the test
reads from the text file itself.

  fixtures/ts_u16.{bin,idx}: 3000 bytes, uint16 (code 8), Megatron's choice for vocabularies < 65500
  fixtures/ts_i32.{bin,idx}: 1000 bytes, int32 (code 4)

Rerun: /opt/venv/bin/python tests/data/make_megatron_fixtures.py
"""
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT = os.path.join(HERE, "..", "..", "data", "tinyshakespeare.txt")
CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.float64: 6, np.float32: 7, np.uint16: 8}


def documents(data):
    """Paragraphs (ending after a blank line), each a list of lines (ending after '\\n')."""
    docs, doc, line = [], [], bytearray()
    for i, b in enumerate(data):
        line.append(b)
        if b == ord("\n"):
            doc.append(bytes(line))
            line = bytearray()
            if i > 0 and data[i - 1] == ord("\n"):
                docs.append(doc)
                doc = []
    if line:
        doc.append(bytes(line))
    if doc:
        docs.append(doc)
    return docs


def write(prefix, docs, dtype):
    sizes, doc_idx = [], [0]
    with open(prefix + ".bin", "wb") as f:
        for doc in docs:
            for seq in doc:
                arr = np.frombuffer(seq, dtype=np.uint8).astype(dtype)
                f.write(arr.tobytes(order="C"))
                sizes.append(arr.size)
            doc_idx.append(len(sizes))
    itemsize = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1])]).astype(np.int64) * itemsize
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(np.array(sizes, dtype=np.int32).tobytes(order="C"))
        f.write(pointers.tobytes(order="C"))
        f.write(np.array(doc_idx, dtype=np.int64).tobytes(order="C"))
    print(f"{prefix}: {len(sizes)} sequences, {len(docs)} documents, {sum(sizes)} tokens, {dtype.__name__}")


def main():
    data = open(TEXT, "rb").read()
    out = os.path.join(HERE, "fixtures")
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "ts_u16"), documents(data[:3000]), np.uint16)
    write(os.path.join(out, "ts_i32"), documents(data[:1000]), np.int32)


if __name__ == "__main__":
    main()
