-- q2, selection (Flink nexmark q2 with its auction % 123 = 0).
SELECT auction, price FROM bid WHERE auction % 123 = 0;
