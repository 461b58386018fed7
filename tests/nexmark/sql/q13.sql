-- q13, bounded side input join (Flink nexmark q13), as a regular join
-- with the side table as it is (the circuit's header says why).
SELECT B.auction, B.bidder, B.price, B.date_time, S.value
FROM bid B JOIN side_input S ON B.auction % 10000 = S.key;
