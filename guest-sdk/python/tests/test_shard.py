"""The SDK's shard function against the host's: vectors the Rust crate
``sluice-shard`` checks it computes (its test
``the_python_sdk_s_vectors_are_this_crate_s_hashes``)."""

import pathlib
import unittest

from sluice.shard import SHARDS, shard_of, xxh3_64

VECTORS = pathlib.Path(__file__).with_name("shard_vectors.txt")


class ShardIsTheHosts(unittest.TestCase):
    def test_every_vector(self):
        lines = VECTORS.read_text().splitlines()
        self.assertGreater(len(lines), 260)
        for line in lines:
            key_hex, want = line.split(" ")
            key = bytes.fromhex(key_hex)
            self.assertEqual(xxh3_64(key), int(want), f"key of {len(key)} bytes")
            self.assertEqual(shard_of(key), int(want) % SHARDS)

    def test_the_empty_key_s_shard_is_fixed(self):
        # The same value the Rust crate pins.
        self.assertEqual(shard_of(b""), 194)


if __name__ == "__main__":
    unittest.main()
