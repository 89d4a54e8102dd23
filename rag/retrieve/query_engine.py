"""`RAG.query_engine`: the engine as a LlamaIndex `BaseQueryEngine`."""

from __future__ import annotations

from typing import Any


def make_query_engine(rag):
    from llama_index.core.base.response.schema import Response
    from llama_index.core.query_engine import CustomQueryEngine
    from llama_index.core.schema import NodeWithScore, TextNode

    from rag.answer.citations import plain_text, reference_lines

    class PaperQueryEngine(CustomQueryEngine):
        """Answers with numbered citations; `response.metadata['answer']` is the full `Answer`."""

        rag: Any

        def custom_query(self, query_str: str):
            answer = self.rag.ask(query_str)
            nodes = [
                NodeWithScore(node=TextNode(id_=f"{s.paper_id}#{s.n}", text=s.passage,
                                            metadata={"paper_id": s.paper_id, "title": s.title, "n": s.n,
                                                      "cited": s.cited, "url": s.url or ""}),
                              score=s.score)
                for s in answer.sources
            ]
            # The text carries its references: an agent's LLM reading `[1]` in a tool's output
            # sees only this text, not the source nodes.
            text = "\n\n".join([plain_text(answer.answer), "\n".join(reference_lines(answer))]).strip()
            return Response(response=text, source_nodes=nodes, metadata={"answer": answer})

    return PaperQueryEngine(rag=rag)
