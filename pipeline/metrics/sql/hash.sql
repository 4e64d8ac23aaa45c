-- Stable integer hashing for the bootstrap draws (docs/explanation/intervals.md; docs/explanation/measured-facts.md).
--
-- DuckDB's hash() may change between versions, and random() is not reproducible across thread
-- schedules, so every draw is derived from this function alone. It is the 32-bit "lowbias32"
-- xorshift-multiply mixer (constants 0x7feb352d, 0x846ca68b), a bijection on [0, 2^32):
--     x ^= x >> 16;  x = x * 0x7feb352d mod 2^32;  x ^= x >> 15;  x = x * 0x846ca68b mod 2^32;  x ^= x >> 16
-- Values are UBIGINT below 2^32, so each product is below 2^64 (no overflow error) and
-- `& 4294967295` is the explicit reduction mod 2^32. tests/test_aggregate.py re-implements it in numpy.
CREATE OR REPLACE TEMP MACRO pexec_lb32_m1(x) AS (xor(x, x >> 16) * 2146121005::UBIGINT) & 4294967295::UBIGINT;
CREATE OR REPLACE TEMP MACRO pexec_lb32_m2(x) AS (xor(x, x >> 15) * 2221713035::UBIGINT) & 4294967295::UBIGINT;
CREATE OR REPLACE TEMP MACRO pexec_lb32_fin(x) AS xor(x, x >> 16);
CREATE OR REPLACE TEMP MACRO pexec_lb32(x) AS pexec_lb32_fin(pexec_lb32_m2(pexec_lb32_m1(x)));

-- Draw (seed, b, i) -> [0, 2^32):  h = lb32(key_b XOR lb32(i)),  key_b = lb32(lb32(seed) XOR b).
-- i is mixed before it is combined with the replicate key so that two replicates never share a run of
-- draws (with key_b XOR i they would whenever two keys agree in their high bits).
CREATE OR REPLACE TEMP MACRO pexec_rep_key(seed, b) AS pexec_lb32(xor(pexec_lb32(seed::UBIGINT), b::UBIGINT));
CREATE OR REPLACE TEMP MACRO pexec_draw(key_b, mixed_i) AS pexec_lb32(xor(key_b, mixed_i));

-- Poisson(1) weight by inverse CDF from the draw h (u = h / 2^32): w = #{k : h >= ceil(2^32 * F(k))},
-- F the Poisson(1) CDF, F(k) for k = 0..11 (ceil(2^32 * F(12)) = 2^32 is out of reach, so w <= 12).
CREATE OR REPLACE TEMP MACRO pexec_poisson1(h) AS
      (h >= 1580030169)::INTEGER + (h >= 3160060338)::INTEGER + (h >= 3950075422)::INTEGER
    + (h >= 4213413784)::INTEGER + (h >= 4279248374)::INTEGER + (h >= 4292415292)::INTEGER
    + (h >= 4294609778)::INTEGER + (h >= 4294923277)::INTEGER + (h >= 4294962464)::INTEGER
    + (h >= 4294966818)::INTEGER + (h >= 4294967253)::INTEGER + (h >= 4294967293)::INTEGER;

-- The 64-bit key of a task for the mergeable Poisson bootstrap (pipeline.metrics.bootstrap "poisson-merged"): the first
-- 8 bytes of md5(task_id) read little-endian, the same in any process that sees the task, on any DuckDB version.
CREATE OR REPLACE TEMP MACRO pexec_task_key(task_id) AS (md5_number(task_id) & 18446744073709551615::UHUGEINT)::UBIGINT;
