-- q0, pass-through (Flink nexmark q0).
SELECT b FROM bid b;
