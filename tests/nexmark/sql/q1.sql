-- q1, currency conversion. Flink's is 0.908 * price (a DECIMAL); the
-- circuit follows the Nexmark reference implementation's integer
-- price * 89 / 100 (its header says so).
SELECT struct_pack(auction, bidder, price := price * 89 // 100, channel, url, date_time, extra)
FROM bid;
