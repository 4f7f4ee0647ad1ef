/**
 * The assignor of a `Partitions` subscription: every member is given exactly the partitions it asked for.
 */
import { AssignerProtocol } from "kafkajs"
import type { PartitionAssigner } from "kafkajs"
import * as TopicPartition from "../../TopicPartition.js"
import { byTopic } from "./member.js"

const STATIC_ASSIGNER = "EffectKafkaStaticAssigner"

const decodeRequested = (userData: Buffer): Array<TopicPartition.TopicPartition> => {
  try {
    const parsed: unknown = JSON.parse(userData.toString("utf8"))
    if (!Array.isArray(parsed)) return []
    const out: Array<TopicPartition.TopicPartition> = []
    for (const item of parsed) {
      if (
        Array.isArray(item) && item.length === 2 && typeof item[0] === "string" && Number.isInteger(item[1])
      ) {
        out.push(TopicPartition.make(item[0], item[1]))
      }
    }
    return out
  } catch {
    return []
  }
}

/**
 * kafkajs has no manual assignment. A `Partitions` subscription joins the group with this assignor, which gives every
 * member exactly the partitions it announced in its join metadata, so nothing is ever moved between members.
 *
 * @internal
 */
export const staticAssigner = (
  requested: ReadonlyArray<TopicPartition.TopicPartition>
): PartitionAssigner =>
() => ({
  name: STATIC_ASSIGNER,
  version: 0,
  protocol: ({ topics }) => ({
    name: STATIC_ASSIGNER,
    metadata: AssignerProtocol.MemberMetadata.encode({
      version: 0,
      topics,
      userData: Buffer.from(JSON.stringify(requested.map((tp) => [tp.topic, tp.partition])), "utf8")
    })
  }),
  assign: ({ members }) =>
    Promise.resolve(members.map(({ memberId, memberMetadata }) => {
      const metadata = AssignerProtocol.MemberMetadata.decode(memberMetadata)
      const assignment: Record<string, Array<number>> = {}
      if (metadata !== null) {
        for (const [topic, partitions] of byTopic(decodeRequested(metadata.userData))) {
          assignment[topic] = partitions
        }
      }
      return {
        memberId,
        memberAssignment: AssignerProtocol.MemberAssignment.encode({
          version: 0,
          assignment,
          userData: Buffer.alloc(0)
        })
      }
    }))
})
