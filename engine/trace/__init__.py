"""Streaming analysis of SGLang's Kineto traces: bucket rules (data), a bounded-memory parser, step statistics."""
