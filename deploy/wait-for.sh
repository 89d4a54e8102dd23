#!/bin/sh
# Wait (up to 60 s) until a URL answers: a replica starts only once its Chroma server does (`rag serve`
# refuses to start without it, in one line).
for _ in $(seq 120); do
    curl -fs -o /dev/null "$1" && exit 0
    sleep 0.5
done
echo "wait-for: $1 did not answer in 60 s" >&2
exit 1
