"""Answer quality: answers on question sets, the answer rules replayed on runs, the support check,
injections."""
