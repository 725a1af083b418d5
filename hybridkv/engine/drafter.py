"""N-gram (prompt-lookup) draft proposer: find the latest earlier occurrence of the last n
tokens (n from ``max_n`` down to ``min_n``) and propose the tokens that followed it."""


class NgramDrafter:
    def __init__(self, k=3, max_n=3, min_n=1):
        if k < 1 or min_n < 1 or max_n < min_n:
            raise ValueError(f"bad drafter sizes k={k} n=[{min_n},{max_n}]")
        self.k, self.max_n, self.min_n = k, max_n, min_n

    def propose(self, tokens):
        """Up to ``k`` draft tokens continuing ``tokens`` (possibly none)."""
        L = len(tokens)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            tail = tokens[L - n:]
            for i in range(L - n - 1, -1, -1):
                if tokens[i:i + n] == tail:
                    return list(tokens[i + n:i + n + self.k])
        return []
