import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeProducersResult.PartitionProducerState;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.common.TopicPartition;

/**
 * Prints what the broker keeps of the producers that wrote to topics' partitions (the DescribeProducers API): one
 * line "producer topic partition producerId producerEpoch lastSequence" per producer. A producer that is not
 * idempotent writes record batches without a producer id, and the broker keeps nothing of it. Arguments: brokers,
 * then each topic as topic:partitionCount.
 */
public class DescribeProducers {
  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
    List<TopicPartition> partitions = new ArrayList<>();
    for (int i = 1; i < args.length; i++) {
      int colon = args[i].lastIndexOf(':');
      String topic = args[i].substring(0, colon);
      int count = Integer.parseInt(args[i].substring(colon + 1));
      for (int p = 0; p < count; p++) partitions.add(new TopicPartition(topic, p));
    }
    try (Admin admin = Admin.create(props)) {
      Map<TopicPartition, PartitionProducerState> states = admin.describeProducers(partitions).all().get();
      for (Map.Entry<TopicPartition, PartitionProducerState> entry : states.entrySet()) {
        for (ProducerState state : entry.getValue().activeProducers()) {
          System.out.println("producer " + entry.getKey().topic() + " " + entry.getKey().partition() + " "
              + state.producerId() + " "
              + state.producerEpoch() + " " + state.lastSequence());
        }
      }
    }
  }
}
