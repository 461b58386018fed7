-- q20, expand bid with auction (Flink nexmark q20).
SELECT B, A FROM bid AS B JOIN auction AS A ON B.auction = A.id WHERE A.category = 10;
